"""start_server() without pytest's fixtures: clean stops, the interpreter-exit guard, start-up failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from loops_mock import BinaryNotFoundError, LoopsMock, ServerStartError, start_server
from lm_support import port_is_closed, process_is_gone, request


def test_a_with_block_starts_and_stops_it_gracefully():
    with start_server(["--api-key", "only-this-key"], admin_token="-starts-with-a-dash") as mock:
        assert isinstance(mock, LoopsMock) and mock.running
        assert mock.api_key == "only-this-key"
        url, port, pid = mock.url, mock.port, mock.process.pid
        assert request(url + "/v1/loops/capabilities", headers={"authorization": "Bearer only-this-key"})[0] == 200
        assert request(url + "/v1/loops/capabilities", headers={"authorization": "Bearer another"})[0] == 401
        assert mock.admin_token == "-starts-with-a-dash" and mock.admin.faults() == []
    assert mock.process.returncode == 0  # SIGTERM: a graceful stop, not the SIGKILL fallback
    assert not mock.running and process_is_gone(pid) and port_is_closed(port)
    assert mock.stop() == 0  # again: a no-op


def test_a_server_stopped_right_after_it_started_still_stops_gracefully():
    # loops-mock sets its SIGTERM handler before it prints its variables: a stop at once is still graceful.
    codes = []
    for _ in range(4):
        mock = start_server()
        codes.append(mock.stop())
    assert codes == [0, 0, 0, 0]


def test_the_server_is_stopped_at_interpreter_exit_when_nobody_stops_it(tmp_path):
    script = tmp_path / "leaves_it_running.py"
    script.write_text(textwrap.dedent('''
        import json, sys
        from loops_mock import start_server
        mock = start_server()   # never stopped: atexit must do it
        print(json.dumps({"pid": mock.process.pid, "port": mock.port}), flush=True)
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    gone = process_is_gone(info["pid"], wait_s=10)
    if not gone:  # do not leak it while failing
        os.killpg(info["pid"], signal.SIGKILL)
    assert gone, "the server outlived the interpreter that started it"
    assert port_is_closed(info["port"])


def test_a_server_that_never_listens_is_killed_after_the_timeout(tmp_path):
    stalls = [sys.executable, "-c", "import sys, time; sys.stderr.write('warming up forever\\n'); sys.stderr.flush(); time.sleep(120)"]
    started = time.monotonic()
    with pytest.raises(ServerStartError) as caught:
        start_server(command=stalls, timeout=1.5)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "did not say it was listening within 1.5 s" in message and "warming up forever" in message
    assert "--admin-token=***)" in message  # the command line is shown without the admin token
    assert process_is_gone(caught.value.pid)


def test_exit_before_listening_gives_the_servers_stderr():
    with pytest.raises(ServerStartError) as caught:
        start_server(["--clock", "sideways"])
    err = caught.value
    assert err.returncode == 2
    assert "loops-mock exited with code 2 before it was listening: loops-mock: " in str(err) and "sideways" in str(err)
    assert "loops-mock: " in err.stderr and "--clock" in err.stderr


def test_an_explicit_command_that_cannot_run():
    with pytest.raises(BinaryNotFoundError) as caught:
        start_server(command="/nonexistent/loops-mock --verbose")
    assert "cannot run the loops-mock command '/nonexistent/loops-mock --verbose' (from the command given)" in str(caught.value)
