"""Tests of the loops-mock Python package against the real server binary.

The binary comes the way the plugin finds it: LOOPS_MOCK_BIN (the vitest harness
sets it to the server run from source), --loops-mock-bin, or loops-mock on PATH.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import pytest

from lm_support import Reply, request

pytest_plugins = ["pytester"]


@pytest.fixture
def api(loops_mock) -> Callable[..., Reply]:
    """Requests to the session's server with its API key: api("POST", "/v1/loops/sessions", body)."""

    def call(method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None) -> Reply:
        url = path if path.startswith("http") else loops_mock.url + path
        return request(url, method, body, {"authorization": f"Bearer {loops_mock.api_key}", **(headers or {})})

    return call
