"""The pytest plugin from the outside: inner pytest sessions (pytester) that use its fixtures and options."""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import pytest

from loops_mock import find_command
from lm_support import port_is_closed, process_is_gone, request

TIMEOUT = 90

# Inner conftest: records the session's server as the session ends, after the plugin's teardown.
RECORDER = '''
import json
import pytest

SEEN = {}

@pytest.fixture(autouse=True)
def _remember_loops_mock(request):
    if "loops_mock" in request.fixturenames:
        SEEN["mock"] = request.getfixturevalue("loops_mock")

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    mock = SEEN.get("mock")
    if mock is not None:
        with open("after.json", "w") as f:
            json.dump({"pid": mock.process.pid, "port": mock.port, "returncode": mock.process.returncode}, f)
'''

CAPABILITIES = '''
import json, os, urllib.request

def capabilities(base_url, key):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(base_url + "/v1/loops/capabilities", headers={"authorization": "Bearer " + key})
    with opener.open(req, timeout=30) as res:
        return res.status
'''


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(RECORDER)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=TIMEOUT)


def after(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "after.json").read_text())


def real_command() -> list:
    """The loops-mock command these tests run with (LOOPS_MOCK_BIN, or loops-mock on PATH)."""
    return find_command()[0]


def test_loops_env_sets_the_variables_for_one_test_and_restores_them(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOOPS_BASE_URL", "http://elsewhere.invalid")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    pytester.makepyfile(CAPABILITIES + '''
def test_with_env(loops_env, loops_mock):
    assert os.environ["LOOPS_BASE_URL"] == loops_mock.url
    assert os.environ["HF_ENDPOINT"] == loops_mock.url + "/hf"
    assert os.environ["BASETEN_API_KEY"] == loops_mock.api_key
    assert loops_env == loops_mock.env
    assert capabilities(os.environ["LOOPS_BASE_URL"], os.environ["BASETEN_API_KEY"]) == 200
    with open("pid-1", "w") as f:
        f.write(str(loops_mock.process.pid))

def test_after_it():
    assert os.environ["LOOPS_BASE_URL"] == "http://elsewhere.invalid"
    assert "HF_ENDPOINT" not in os.environ

def test_same_server_for_the_session(loops_mock):
    assert open("pid-1").read() == str(loops_mock.process.pid)
    assert "LOOPS_BASE_URL" in os.environ and os.environ["LOOPS_BASE_URL"] != loops_mock.url
''')
    result = run_inner(pytester)
    result.assert_outcomes(passed=3)
    assert after(pytester)["returncode"] == 0  # stopped at session end with SIGTERM, gracefully


def test_teardown_stops_the_server_even_when_a_test_fails(pytester: pytest.Pytester):
    pytester.makepyfile('''
import json

def test_fails(loops_mock):
    with open("during.json", "w") as f:
        json.dump({"pid": loops_mock.process.pid, "port": loops_mock.port, "running": loops_mock.running}, f)
    assert False, "this inner test fails on purpose"
''')
    result = run_inner(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*this inner test fails on purpose*"])
    during = json.loads((pytester.path / "during.json").read_text())
    assert during["running"] is True
    assert after(pytester) == {"pid": during["pid"], "port": during["port"], "returncode": 0}
    assert process_is_gone(during["pid"])
    assert port_is_closed(during["port"])


def test_loops_mock_args_reach_the_server_virtual_clock(pytester: pytest.Pytester):
    pytester.makepyfile('''
def test_advance(loops_mock):
    assert loops_mock.command[-2:] == ["--clock", "virtual"]
    before = loops_mock.admin.clock()
    assert before["mode"] == "virtual"
    moved = loops_mock.admin.advance(3_600_000)
    assert moved["now_ms"] == before["now_ms"] + 3_600_000
    assert loops_mock.admin.clock()["now_ms"] == before["now_ms"] + 3_600_000
''')
    run_inner(pytester, "--loops-mock-args=--clock virtual").assert_outcomes(passed=1)


def test_loops_mock_args_are_repeatable_and_may_set_the_admin_token(pytester: pytest.Pytester):
    pytester.makepyfile('''
def test_token(loops_mock):
    assert loops_mock.admin_token == "my token"
    assert loops_mock.admin.settings()["floor_wait_ms"] == 250
''')
    run_inner(pytester, "--loops-mock-args=--floor-wait-ms 250", "--loops-mock-args=--admin-token 'my token'").assert_outcomes(passed=1)


def test_proxy_mode_url_comes_from_the_listening_line(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("LOOPS_BASE_URL", "http://elsewhere.invalid")
    pytester.makepyfile('''
import os

def test_proxy(loops_mock, loops_env):
    assert "LOOPS_BASE_URL" not in loops_mock.env and loops_mock.proxy_mode
    assert loops_mock.env["HTTPS_PROXY"] == loops_mock.url
    assert os.environ["HTTPS_PROXY"] == loops_mock.url and os.path.exists(os.environ["SSL_CERT_FILE"])
    assert "LOOPS_BASE_URL" not in os.environ   # a stale one would send clients elsewhere
    assert loops_mock.admin.clock()["mode"] == "real"
''')
    run_inner(pytester, f"--loops-mock-args=--proxy --ca-dir {shlex.quote(str(tmp_path / 'ca'))}").assert_outcomes(passed=1)


def test_a_bad_flag_fails_with_the_servers_message(pytester: pytest.Pytester):
    pytester.makepyfile('''
def test_one(loops_mock):
    pass

def test_two(loops_mock):
    pass
''')
    result = run_inner(pytester, "--loops-mock-args=--no-such-flag")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*loops_mock: loops-mock exited with code 2 before it was listening: loops-mock: unknown flag --no-such-flag*"])
    assert "Traceback" not in result.stdout.str()
    assert not (pytester.path / "after.json").exists()


def test_a_missing_binary_says_how_to_install_or_point_at_it(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOOPS_MOCK_BIN", "/nonexistent/bin/loops-mock")
    pytester.makepyfile("def test_one(loops_mock):\n    pass\n")
    result = run_inner(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*cannot run the loops-mock command '/nonexistent/bin/loops-mock' (from LOOPS_MOCK_BIN): No such file or directory."
        " Install it with 'npm install --save-dev loops-mock'*or name its command line in LOOPS_MOCK_BIN or with pytest's --loops-mock-bin*",
    ])
    assert "skipped" not in result.stdout.str()


def test_no_binary_anywhere_is_an_error_not_a_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("LOOPS_MOCK_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    pytester.makepyfile("def test_one(loops_mock):\n    pass\n")
    result = run_inner(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*loops-mock was not found: LOOPS_MOCK_BIN is not set, no 'loops-mock' is on PATH*node_modules?.bin*"])


def write_wrapper(path: Path, command: list) -> Path:
    """An executable 'loops-mock' that runs the real command, as npm's bin link would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexec {shlex.join(command)} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_loops_mock_on_path_is_found(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    wrapper = write_wrapper(tmp_path / "bin" / "loops-mock", real_command())
    monkeypatch.delenv("LOOPS_MOCK_BIN", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    pytester.makepyfile(CAPABILITIES + f'''
def test_found(loops_mock):
    assert loops_mock.command[0] == {str(wrapper)!r}
    assert capabilities(loops_mock.url, loops_mock.api_key) == 200
''')
    run_inner(pytester).assert_outcomes(passed=1)


def test_node_modules_bin_under_the_rootdir_is_found(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    wrapper = write_wrapper(pytester.path / "node_modules" / ".bin" / "loops-mock", real_command())
    monkeypatch.delenv("LOOPS_MOCK_BIN", raising=False)
    # PATH keeps what the real command needs (node), without any loops-mock on it.
    path = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "loops-mock").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    pytester.makepyfile(f'''
def test_found(loops_mock):
    assert loops_mock.command[0] == {str(wrapper)!r}
''')
    run_inner(pytester).assert_outcomes(passed=1)


def test_the_bin_option_wins_over_the_environment(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    command = real_command()
    monkeypatch.setenv("LOOPS_MOCK_BIN", "/nonexistent/bin/loops-mock")
    pytester.makepyfile(f'''
def test_found(loops_mock):
    assert loops_mock.command[:{len(command)}] == {command!r}
''')
    run_inner(pytester, f"--loops-mock-bin={shlex.join(command)}").assert_outcomes(passed=1)


def test_the_options_are_in_pytest_help(pytester: pytest.Pytester):
    result = pytester.runpytest_subprocess("--help", timeout=TIMEOUT)
    result.stdout.fnmatch_lines(["*--loops-mock-bin=CMD*", "*--loops-mock-args=ARGS*", "*--loops-mock-timeout=S*"])


def test_an_unused_fixture_starts_no_server(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOOPS_MOCK_BIN", "/nonexistent/bin/loops-mock")
    pytester.makepyfile("def test_plain():\n    assert True\n")
    run_inner(pytester).assert_outcomes(passed=1)


def test_the_outer_session_server_answers(loops_mock):
    # Not an inner run: this module's own session server, as a project's tests would use it.
    assert request(loops_mock.url + "/v1/loops/capabilities", headers={"authorization": f"Bearer {loops_mock.api_key}"})[0] == 200
