"""Shared fixtures of the client tests.

These tests are started by server/test/unmodified-clients.test.ts (part of `npm test`), which
runs two loops-mock servers, one direct and one in proxy mode, and describes them in
LOOPS_MOCK_CLIENT_TESTS (a JSON file). Each test runs a real client library in a child Python
process whose environment holds only what a user would set: the printed variables, nothing
else, so a client that works here works unmodified.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture(scope="session")
def mock():
    path = os.environ.get("LOOPS_MOCK_CLIENT_TESTS")
    if not path:
        pytest.fail("LOOPS_MOCK_CLIENT_TESTS is not set: run these tests through `npm test` "
                    "(server/test/unmodified-clients.test.ts starts the servers they need)")
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def run_client(tmp_path):
    """Runs `code` in a fresh Python with `env` alone (plus PATH and a private HOME/HF cache); returns its stdout as JSON."""

    def run(code, env, expect_ok=True):
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        child_env = {"PATH": os.environ["PATH"], "HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", **env}
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_env, capture_output=True, text=True, timeout=180)
        if expect_ok and done.returncode != 0:
            pytest.fail(f"client failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        return (json.loads(lines[-1]) if lines else None), done

    return run


@pytest.fixture
def proxy_env(mock):
    """What `loops-mock serve --proxy` prints, and nothing else."""
    return dict(mock["proxy_env"])


@pytest.fixture
def endpoint_env(mock):
    """HF_ENDPOINT as `loops-mock serve` prints it."""
    return {"HF_ENDPOINT": mock["direct_env"]["HF_ENDPOINT"]}
