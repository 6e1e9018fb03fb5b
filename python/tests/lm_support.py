"""Helpers of these tests: plain urllib requests and port checks."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Tuple

Reply = Tuple[int, Any]


def request(url: str, method: str = "GET", body: Any = None, headers: Optional[Dict[str, str]] = None) -> Reply:
    """One HTTP request with urllib, no proxies: (status, parsed JSON body or None)."""
    data = None if body is None else json.dumps(body).encode()
    all_headers = {"content-type": "application/json"} if body is not None else {}
    all_headers.update(headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=all_headers, method=method), timeout=30) as res:
            status, text = res.status, res.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    return status, (json.loads(text) if text else None)


def port_is_closed(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:port any more."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def process_is_gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process pid has exited (waits a little: an orphan is reaped by init)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _is_zombie(pid):  # exited, not yet reaped by whoever inherited it
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
