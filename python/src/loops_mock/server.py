"""Starting and stopping the loops-mock server binary, with or without pytest.

``start_server()`` runs ``loops-mock serve --port 0 --exit-with-parent --admin
--admin-token <random>`` in its own session (it stops by itself if this process dies), reads the ``NAME=value`` lines it prints up to its
``# loops-mock <version> listening on URL`` line, and returns a
:class:`LoopsMock`. Use it as a context manager, or call ``stop()``:

    with start_server(["--clock", "virtual"]) as mock:
        os.environ.update(mock.env)
        mock.admin.advance(60_000)

The binary: ``command=`` if given, else ``$LOOPS_MOCK_BIN`` (a command line,
split as a shell would: ``node /path/to/dist/server/cli.js`` works), else
``loops-mock`` on ``PATH``, else ``node_modules/.bin/loops-mock`` in one of
``search_dirs`` (default: the current directory). Never ``npx``.
"""

from __future__ import annotations

import atexit
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .admin import LoopsMockError, MockAdmin

__all__ = [
    "BIN_ENV",
    "ServerStartError",
    "BinaryNotFoundError",
    "LoopsMock",
    "find_command",
    "start_server",
]

BIN_ENV = "LOOPS_MOCK_BIN"
"""The environment variable naming the loops-mock command line."""

DEFAULT_START_TIMEOUT = 30.0
DEFAULT_STOP_TIMEOUT = 10.0

_LISTENING = re.compile(r"listening on (https?://[^\s,]+)")
_VARIABLE = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")

HOW_TO_INSTALL = (
    "Install it with 'npm install --save-dev loops-mock' (then it is node_modules/.bin/loops-mock) and put it on PATH, "
    f"or name its command line in {BIN_ENV} or with pytest's --loops-mock-bin, "
    f"e.g. {BIN_ENV}='node_modules/.bin/loops-mock' or {BIN_ENV}='node /path/to/loops-mock/dist/server/cli.js'."
)


class ServerStartError(LoopsMockError):
    """loops-mock could not be started, or exited or stalled before it was listening."""

    def __init__(self, message: str, *, command: Optional[Sequence[str]] = None, returncode: Optional[int] = None, stderr: str = "", pid: Optional[int] = None) -> None:
        super().__init__(message)
        self.command = list(command) if command is not None else None
        self.returncode = returncode
        self.stderr = stderr
        self.pid = pid


class BinaryNotFoundError(ServerStartError):
    """No loops-mock command was found, or the one named cannot be run."""


def find_command(command: Union[str, Sequence[str], None] = None, *, search_dirs: Optional[Iterable[Union[str, Path]]] = None) -> Tuple[List[str], str]:
    """The loops-mock command line and where it came from (for messages).

    ``command`` (a string is split with :func:`shlex.split`), else ``$LOOPS_MOCK_BIN``,
    else ``loops-mock`` on ``PATH``, else ``node_modules/.bin/loops-mock`` in
    ``search_dirs``. Raises :class:`BinaryNotFoundError` when none is there.
    """
    if command is not None and command != "" and command != []:
        argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        return argv, "the command given"
    from_env = os.environ.get(BIN_ENV, "").strip()
    if from_env:
        return shlex.split(from_env), BIN_ENV
    on_path = shutil.which("loops-mock")
    if on_path:
        return [on_path], "PATH"
    dirs = [Path.cwd()] if search_dirs is None else [Path(d) for d in search_dirs]
    for folder in dirs:
        candidate = folder / "node_modules" / ".bin" / "loops-mock"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return [str(candidate)], str(folder / "node_modules" / ".bin")
    looked = ", ".join(str(d / "node_modules" / ".bin") for d in dirs)
    raise BinaryNotFoundError(
        f"loops-mock was not found: {BIN_ENV} is not set, no 'loops-mock' is on PATH"
        + (f", and none is in {looked}" if looked else "")
        + f". {HOW_TO_INSTALL}"
    )


def _admin_token_in(args: Sequence[str]) -> Optional[str]:
    """The last --admin-token the args give (the server takes the last), if any."""
    token = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--admin-token" and i + 1 < len(args):
            token = args[i + 1]
        elif arg.startswith("--admin-token="):
            token = arg.split("=", 1)[1]
    return token


class _Live:
    """Everything of a running server that is not part of LoopsMock's public face."""

    def __init__(self, process: "subprocess.Popen[str]", stderr: IO[bytes]) -> None:
        self.process = process
        self.stderr = stderr
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stdout_tail: Deque[str] = deque(maxlen=200)
        self.lock = threading.Lock()
        self.stopped = False
        self.final_stderr: Optional[str] = None
        self.reader = threading.Thread(target=self._read, name=f"loops-mock-stdout-{process.pid}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        # Drains stdout for as long as the server lives, so that it never blocks on a full pipe.
        stream = self.process.stdout
        assert stream is not None
        try:
            for line in stream:
                self.stdout_tail.append(line)
                self.lines.put(line)
        except (OSError, ValueError):
            pass
        finally:
            self.lines.put(None)

    def stderr_text(self, limit: int = 8000) -> str:
        if self.final_stderr is not None:
            return self.final_stderr[-limit:]
        try:
            fd = self.stderr.fileno()
            size = os.fstat(fd).st_size
            start = max(0, size - limit)
            data = os.pread(fd, size - start, start) if hasattr(os, "pread") else b""
        except (OSError, ValueError):
            return ""
        return data.decode("utf-8", "replace")


_RUNNING: "set[LoopsMock]" = set()
_RUNNING_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for mock in running:
        try:
            mock.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_stop_all_at_exit)


@dataclass(eq=False)
class LoopsMock:
    """A running loops-mock server.

    ``env`` holds the variables it printed (``LOOPS_BASE_URL``, ``BASETEN_API_KEY``,
    ``BASETEN_MANAGEMENT_API_URL_OVERRIDE``, ``HF_ENDPOINT``; in ``--proxy`` mode
    ``BASETEN_API_KEY``, ``HTTPS_PROXY`` and the CA variables instead), ``url``
    where it listens, ``api_key`` a key it accepts, ``admin`` its admin API.
    """

    env: Dict[str, str]
    url: str
    api_key: str
    admin: MockAdmin
    process: "subprocess.Popen[str]"
    command: List[str] = field(default_factory=list, repr=False)
    admin_token: Optional[str] = field(default=None, repr=False)
    notes: List[str] = field(default_factory=list, repr=False)
    _live: Optional[_Live] = field(default=None, repr=False, compare=False)

    @property
    def port(self) -> int:
        """The port it listens on."""
        match = re.search(r":(\d+)$", self.url.rstrip("/"))
        return int(match.group(1)) if match else 80

    @property
    def proxy_mode(self) -> bool:
        """Whether it runs with ``--proxy`` (its env has ``HTTPS_PROXY`` and no ``LOOPS_BASE_URL``)."""
        return "HTTPS_PROXY" in self.env

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stderr_tail(self, limit: int = 8000) -> str:
        """The last ``limit`` bytes the server wrote on stderr (its log, ``--log-level``)."""
        return self._live.stderr_text(limit) if self._live else ""

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> Optional[int]:
        """Stops the server: SIGTERM (graceful, exit 0), then SIGKILL of its process group after ``timeout`` s.

        Safe to call more than once; returns the exit code.
        """
        live = self._live
        if live is None:
            return self.process.poll()
        with live.lock:
            if not live.stopped:
                live.stopped = True
                _terminate(self.process, timeout)
                # The reader sees end of file once the server is gone; close the pipe after it.
                live.reader.join(timeout=2.0)
                if not live.reader.is_alive() and self.process.stdout is not None:
                    self.process.stdout.close()
                live.final_stderr = live.stderr_text(64_000)
                live.stderr.close()
            with _RUNNING_LOCK:
                _RUNNING.discard(self)
        return self.process.returncode

    def __enter__(self) -> "LoopsMock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _signal_group(process: "subprocess.Popen[str]", sig: int) -> bool:
    """Sends ``sig`` to the server's process group (its own session); False when nothing is left in it."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        # No such group (the server left the session it was started in): signal the process itself.
        if process.poll() is not None:
            return False
        try:
            process.send_signal(sig)
        except OSError:
            return False
    return True


def _terminate(process: "subprocess.Popen[str]", timeout: float) -> None:
    deadline = time.monotonic() + timeout
    if os.name == "posix":
        _signal_group(process, signal.SIGTERM)
    elif process.poll() is None:  # pragma: no cover - Windows
        process.terminate()
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    # The leader is gone (or late): wait for anything else in its group (a wrapper's child), then kill what remains.
    if os.name == "posix":
        while time.monotonic() < deadline and _signal_group(process, 0):
            time.sleep(0.05)
        _signal_group(process, signal.SIGKILL)
    elif process.poll() is None:
        process.kill()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL does not stop
        pass


def _masked(arg: str, token: Optional[str]) -> str:
    if token is not None and arg == token:
        return "***"
    if token is not None and arg == f"--admin-token={token}":
        return "--admin-token=***"
    return shlex.quote(arg)


def _last_lines(text: str, count: int = 20) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def start_server(
    args: Union[str, Sequence[str]] = (),
    *,
    command: Union[str, Sequence[str], None] = None,
    admin: bool = True,
    admin_token: Optional[str] = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    env: Optional[Mapping[str, str]] = None,
    cwd: Union[str, Path, None] = None,
    search_dirs: Optional[Iterable[Union[str, Path]]] = None,
) -> LoopsMock:
    """Starts ``loops-mock serve --port 0`` and returns it once it is listening.

    ``args`` are more flags (a string is split with :func:`shlex.split`); they come
    last, so they win over the ones put first. With ``admin`` (the default) the
    server gets ``--admin --admin-token=<token>`` (``admin_token``, else a random
    one, unless ``args`` give their own). ``env`` replaces the server's environment
    (default: this process's). ``timeout``: seconds to wait for it to listen.

    Raises :class:`BinaryNotFoundError` when there is no binary to run, and
    :class:`ServerStartError` (with the server's last stderr lines) when it exits
    or stays silent before listening. The server stops at :meth:`LoopsMock.stop`,
    at the end of a ``with`` block, or at interpreter exit at the latest.
    """
    extra = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    base, source = find_command(command, search_dirs=search_dirs)
    if not base:
        raise BinaryNotFoundError(f"{source} is an empty command line. {HOW_TO_INSTALL}")
    argv = list(base)
    if argv[-1] != "serve":
        argv.append("serve")
    # --exit-with-parent: the server stops by itself once this process is gone, even when pytest is killed
    # with SIGKILL or SIGTERM (neither runs atexit), so no run leaves a server behind.
    argv += ["--port", "0", "--exit-with-parent"]
    token = None
    if admin:
        token = _admin_token_in(extra)
        argv.append("--admin")
        if token is None:
            token = admin_token if admin_token is not None else secrets.token_hex(16)
            argv.append(f"--admin-token={token}")  # the = form: a token may start with '-'
    argv += extra

    stderr = tempfile.TemporaryFile(prefix="loops-mock-", suffix=".log")
    popen_kwargs: Dict[str, Any] = {}
    if os.name == "posix":
        popen_kwargs["start_new_session"] = True
    else:  # pragma: no cover - Windows
        popen_kwargs["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd is not None else None,
            **popen_kwargs,
        )
    except OSError as err:
        stderr.close()
        raise BinaryNotFoundError(
            f"cannot run the loops-mock command {shlex.join(base)!r} (from {source}): {err.strerror or err}. {HOW_TO_INSTALL}",
            command=argv,
        ) from None

    live = _Live(process, stderr)
    mock = LoopsMock(env={}, url="", api_key="", admin=MockAdmin(""), process=process, command=argv, admin_token=token, _live=live)
    with _RUNNING_LOCK:
        _RUNNING.add(mock)
    try:
        env_vars, url, notes = _read_startup(mock, live, timeout)
    except BaseException:
        mock.stop(timeout=2.0)
        raise
    mock.env = env_vars
    mock.url = url
    mock.notes = notes
    mock.api_key = env_vars.get("BASETEN_API_KEY", "")
    mock.admin = MockAdmin(url, token)
    return mock


def _read_startup(mock: LoopsMock, live: _Live, timeout: float) -> Tuple[Dict[str, str], str, List[str]]:
    env_vars: Dict[str, str] = {}
    notes: List[str] = []
    seen: List[str] = []
    deadline = time.monotonic() + timeout
    # The command line as messages show it: without the admin token.
    command = " ".join(_masked(arg, mock.admin_token) for arg in mock.command)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            mock.stop(timeout=2.0)
            tail = _last_lines(live.stderr_text())  # kept by stop()
            printed = "".join(seen).strip()
            raise ServerStartError(
                f"loops-mock did not say it was listening within {timeout:g} s ({command})"
                + (f"; it printed:\n{printed}" if printed else "; it printed nothing")
                + (f"\nits stderr ends with:\n{tail}" if tail else ""),
                command=mock.command, stderr=tail, pid=mock.process.pid,
            )
        try:
            line = live.lines.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if line is None:
            try:
                code = mock.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            tail = _last_lines(live.stderr_text())
            printed = _last_lines("".join(seen), 5)
            # Its own one-line reason ("loops-mock: unknown flag --x ...") when it gave one, beside any runtime warnings.
            own = [line for line in tail.splitlines() if line.startswith("loops-mock: ")]
            reason = own[-1] if own else tail or printed or "it printed nothing"
            raise ServerStartError(
                f"loops-mock exited{'' if code is None else f' with code {code}'} before it was listening: {reason}\n(command: {command})",
                command=mock.command, returncode=code, stderr=tail, pid=mock.process.pid,
            )
        seen.append(line)
        text = line.rstrip("\r\n")
        if text.startswith("#"):
            notes.append(text)
            found = _LISTENING.search(text)
            if found:
                return env_vars, found.group(1).rstrip("/"), notes
            continue
        variable = _VARIABLE.match(text)
        if variable:
            env_vars[variable.group(1)] = variable.group(2)

