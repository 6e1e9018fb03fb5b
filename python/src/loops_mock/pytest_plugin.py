"""The pytest plugin (entry point ``loops_mock``): fixtures ``loops_mock`` and ``loops_env``.

``loops_mock`` (session): one loops-mock server for the whole test session,
started with ``serve --port 0 --admin --admin-token <random>`` plus
``--loops-mock-args``, stopped at the end of the session however the tests went.

``loops_env`` (function): the server's printed variables in ``os.environ`` for
one test, put back as they were afterwards.

Options: ``--loops-mock-bin CMD`` (else ``$LOOPS_MOCK_BIN``, else ``loops-mock`` on
PATH, else ``node_modules/.bin/loops-mock`` under the rootdir or the current
directory), ``--loops-mock-args ARGS`` (repeatable; shell-split), and
``--loops-mock-timeout S``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from .server import BIN_ENV, DEFAULT_START_TIMEOUT, LoopsMock, ServerStartError, start_server

# Variables of the other mode, taken out of os.environ by loops_env so that a stale one
# does not send a client elsewhere (a LOOPS_BASE_URL makes Baseten's campaign.py refuse to run).
_DIRECT_VARIABLES = ("LOOPS_BASE_URL", "BASETEN_MANAGEMENT_API_URL_OVERRIDE", "HF_ENDPOINT")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loops-mock", "loops-mock server (loops_mock, loops_env fixtures)")
    group.addoption(
        "--loops-mock-bin",
        metavar="CMD",
        default=None,
        help=f"the loops-mock command line, e.g. 'node_modules/.bin/loops-mock' or 'node /path/dist/server/cli.js' "
        f"(default: ${BIN_ENV}, else loops-mock on PATH, else node_modules/.bin/loops-mock)",
    )
    group.addoption(
        "--loops-mock-args",
        metavar="ARGS",
        action="append",
        default=[],
        help="more flags for 'loops-mock serve', shell-split, e.g. \"--clock virtual --scenario lagging-replica\" (repeatable)",
    )
    group.addoption(
        "--loops-mock-timeout",
        metavar="S",
        type=float,
        default=DEFAULT_START_TIMEOUT,
        help=f"seconds to wait for loops-mock to listen (default {DEFAULT_START_TIMEOUT:g})",
    )


def _server_args(config: pytest.Config) -> List[str]:
    args: List[str] = []
    for chunk in config.getoption("loops_mock_args") or []:
        args += shlex.split(chunk)
    return args


@pytest.fixture(scope="session")
def loops_mock(request: pytest.FixtureRequest) -> Iterator[LoopsMock]:
    """A loops-mock server for the session: ``.env``, ``.url``, ``.api_key``, ``.admin`` (a MockAdmin), ``.process``."""
    config = request.config
    failure = None
    try:
        mock = start_server(
            _server_args(config),
            command=config.getoption("loops_mock_bin"),
            timeout=config.getoption("loops_mock_timeout"),
            search_dirs=list(dict.fromkeys([Path(str(config.rootpath)), Path.cwd()])),
        )
    except ServerStartError as err:
        failure = f"loops_mock: {err}"
    if failure is not None:
        # An error of the test's setup with the message alone (never a skip): the server's own words, or how to get it.
        pytest.fail(failure, pytrace=False)
    try:
        yield mock
    finally:
        mock.stop()


@pytest.fixture
def loops_env(loops_mock: LoopsMock, monkeypatch: pytest.MonkeyPatch) -> Dict[str, str]:
    """Puts loops-mock's variables into ``os.environ`` for this test; restores them afterwards. Returns them."""
    if loops_mock.proxy_mode:
        for name in _DIRECT_VARIABLES:
            monkeypatch.delenv(name, raising=False)
    for name, value in loops_mock.env.items():
        monkeypatch.setenv(name, value)
    return dict(loops_mock.env)
