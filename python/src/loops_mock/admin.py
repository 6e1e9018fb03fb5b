"""A typed client of loops-mock's admin API (``/_mock/...``, docs/admin.md).

Standard library only. Every call that does not answer 2xx raises
:class:`MockAdminError` (or one of its subclasses by status) carrying the
status, the server's error ``type`` and ``message``, and the whole body.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Type

__all__ = [
    "LoopsMockError",
    "MockAdminError",
    "MockAdminBadRequest",
    "MockAdminUnauthorized",
    "MockAdminNotFound",
    "MockAdminConflict",
    "MockAdminConnectionError",
    "MockAdmin",
]


class LoopsMockError(Exception):
    """Base class of every error this package raises."""


class MockAdminError(LoopsMockError):
    """An admin API call that answered an error status.

    ``status`` is the HTTP status, ``type`` and ``message`` come from the
    server's ``{"error": {"type", "message", ...}}`` body (``None`` when the
    body has no such object), ``body`` is the parsed body (or its text when
    it is not JSON).
    """

    def __init__(self, status: int, type: Optional[str], message: Optional[str], body: Any, *, method: str = "", path: str = "") -> None:
        self.status = status
        self.type = type
        self.message = message
        self.body = body
        self.method = method
        self.path = path
        where = f"{method} {path} " if method else ""
        what = f"{type}: {message}" if type or message else json.dumps(body) if not isinstance(body, str) else body
        super().__init__(f"loops-mock admin API {where}answered {status}: {what}")

    @property
    def error(self) -> Dict[str, Any]:
        """The ``error`` object of the body (``{}`` when there is none): ``field``, ``line``, ..."""
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return self.body["error"]
        return {}


class MockAdminBadRequest(MockAdminError):
    """400: the request was invalid (a bad fault rule, scenario, setting...)."""


class MockAdminUnauthorized(MockAdminError):
    """401: the server runs with ``--admin-token`` and the token was missing or wrong."""


class MockAdminNotFound(MockAdminError):
    """404: no such rule, operation or sampler (or the server runs without ``--admin``)."""


class MockAdminConflict(MockAdminError):
    """409: the call does not apply now (advancing a real clock, releasing an operation that is not held)."""


class MockAdminConnectionError(LoopsMockError):
    """The admin API could not be reached at all (the server is not running?)."""


_BY_STATUS: Dict[int, Type[MockAdminError]] = {
    400: MockAdminBadRequest,
    401: MockAdminUnauthorized,
    404: MockAdminNotFound,
    409: MockAdminConflict,
}


_UNSET: Any = object()


def _quote(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")


class MockAdmin:
    """The admin API of one loops-mock server: ``MockAdmin(url, token)``.

    Methods follow the TypeScript client ``MockAdmin`` (server/admin/client.ts)
    in snake_case, and return the server's JSON as dicts and lists.
    """

    def __init__(self, base_url: str, token: Optional[str] = None, *, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # The server is local: never send admin calls through HTTP(S)_PROXY from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return f"MockAdmin({self.base_url!r}{', token=...' if self.token is not None else ''})"

    # ---- reset and journal --------------------------------------------------

    def reset(self) -> Dict[str, Any]:
        """Back to an empty server with the start-up configuration (``POST /_mock/reset``)."""
        return self._call("POST", "/_mock/reset")

    def journal(
        self,
        surface: Optional[str] = None,
        run_id: Optional[str] = None,
        sampler_id: Optional[str] = None,
        since: Optional[int] = None,
        limit: Optional[int] = None,
        **query: Any,
    ) -> Dict[str, Any]:
        """Requests in arrival order: ``{"entries": [...], "next_since": int, "evicted": int}``.

        ``since`` is a ``seq``: only later entries come back (pass the previous
        answer's ``next_since`` to read on). Other keywords go into the query string.
        """
        params = {"surface": surface, "run_id": run_id, "sampler_id": sampler_id, "since": since, "limit": limit, **query}
        qs = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self._call("GET", "/_mock/journal" + (f"?{qs}" if qs else ""))

    # ---- fault rules ----------------------------------------------------------

    def add_fault(self, rule: Mapping[str, Any]) -> Dict[str, Any]:
        """Adds a fault rule (``{"match", "action", "times", ...}``); returns it with its ``id``."""
        return self._call("POST", "/_mock/faults", dict(rule))

    def faults(self) -> List[Dict[str, Any]]:
        """The fault rules, with ``matched``, ``fired`` and ``remaining``."""
        return self._call("GET", "/_mock/faults")["faults"]

    def delete_fault(self, fault_id: str) -> Dict[str, Any]:
        """Removes one fault rule; returns it."""
        return self._call("DELETE", f"/_mock/faults/{_quote(fault_id)}")

    remove_fault = delete_fault

    def clear_faults(self) -> Dict[str, Any]:
        """Removes every fault rule: ``{"removed": n}``."""
        return self._call("DELETE", "/_mock/faults")

    # ---- operation progress -----------------------------------------------------

    def add_progress(self, rule: Mapping[str, Any]) -> Dict[str, Any]:
        """Adds an operation progress rule (``{"match", "mode", "polls"|"ms", "times"}``)."""
        return self._call("POST", "/_mock/progress", dict(rule))

    def progress_rules(self) -> List[Dict[str, Any]]:
        """The operation progress rules."""
        return self._call("GET", "/_mock/progress")["progress"]

    def delete_progress(self, rule_id: str) -> Dict[str, Any]:
        """Removes one progress rule (operations it holds stay held until released)."""
        return self._call("DELETE", f"/_mock/progress/{_quote(rule_id)}")

    def clear_progress(self) -> Dict[str, Any]:
        """Removes every progress rule: ``{"removed": n}``."""
        return self._call("DELETE", "/_mock/progress")

    def held_operations(self) -> List[Dict[str, Any]]:
        """Operations a progress rule holds back now."""
        return self._call("GET", "/_mock/operations")["held"]

    def release(self, operation_id: str) -> Dict[str, Any]:
        """Releases a held operation (:class:`MockAdminConflict` when it is not held)."""
        return self._call("POST", f"/_mock/operations/{_quote(operation_id)}/release")

    # ---- samplers -------------------------------------------------------------

    def sampler(self, sampler_id: str) -> Dict[str, Any]:
        """A sampler's replicas: live, syncing and pending versions, delays, paused."""
        return self._call("GET", f"/_mock/samplers/{_quote(sampler_id)}")

    def set_replicas(self, sampler_id: str, replicas: int) -> Dict[str, Any]:
        """Grows or shrinks a sampler to ``replicas`` replicas."""
        return self._call("PATCH", f"/_mock/samplers/{_quote(sampler_id)}", {"replicas": replicas})

    def control_replica(self, sampler_id: str, replica: int, *, sync_delay_ms: Any = _UNSET, paused: Optional[bool] = None) -> Dict[str, Any]:
        """Sets one replica's own sync delay (``None``: back to the settings') and pauses or resumes its weight sync."""
        change: Dict[str, Any] = {}
        if sync_delay_ms is not _UNSET:
            change["sync_delay_ms"] = sync_delay_ms
        if paused is not None:
            change["paused"] = paused
        return self._call("PATCH", f"/_mock/samplers/{_quote(sampler_id)}/replicas/{int(replica)}", change)

    # ---- settings, clock, scenarios ---------------------------------------------

    def settings(self) -> Dict[str, Any]:
        """The live settings (docs/admin.md#settings)."""
        return self._call("GET", "/_mock/settings")

    def patch_settings(self, values: Optional[Mapping[str, Any]] = None, **more: Any) -> Dict[str, Any]:
        """Changes settings (``patch_settings(floor_wait_ms=300)``); returns all of them."""
        return self._call("PATCH", "/_mock/settings", {**(values or {}), **more})

    update_settings = patch_settings

    def clock(self) -> Dict[str, Any]:
        """The server's time and clock mode: ``{"mode", "now", "now_ms"}``."""
        return self._call("GET", "/_mock/clock")

    def advance(self, ms: int) -> Dict[str, Any]:
        """Moves virtual time ``ms`` forward, firing every timer on the way (:class:`MockAdminConflict` on a real clock)."""
        return self._call("POST", "/_mock/clock/advance", {"ms": ms})

    advance_clock = advance

    def scenarios(self) -> List[str]:
        """The names of the shipped scenarios."""
        return self._call("GET", "/_mock/scenarios")["scenarios"]

    def apply_scenario(self, name: Optional[str] = None, *, scenario: Optional[Mapping[str, Any]] = None, text: Optional[str] = None) -> Dict[str, Any]:
        """Applies a shipped scenario by ``name``, a ``scenario`` dict, or JSON/YAML ``text`` (exactly one)."""
        given = [(k, v) for k, v in (("name", name), ("scenario", scenario), ("text", text)) if v is not None]
        if len(given) != 1:
            raise TypeError("apply_scenario() takes exactly one of name, scenario or text")
        key, value = given[0]
        return self._call("POST", "/_mock/scenario", {key: dict(value) if key == "scenario" else value})

    # ---- transport ----------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        # Marks the call as no browser's simple request: the admin API refuses changes without it (docs/admin.md).
        headers = {"accept": "application/json", "x-loops-mock-admin": "1"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            headers["content-type"] = "application/json"
            data = json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                text = response.read().decode("utf-8")
        except urllib.error.HTTPError as err:
            raw = err.read().decode("utf-8", "replace")
            err.close()
            raise self._error(err.code, raw, method, path) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise MockAdminConnectionError(f"cannot reach the loops-mock admin API at {self.base_url} ({method} {path}): {reason}") from None
        return json.loads(text) if text else None

    @staticmethod
    def _error(status: int, raw: str, method: str, path: str) -> MockAdminError:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        error = body.get("error") if isinstance(body, dict) else None
        type_ = error.get("type") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        cls = _BY_STATUS.get(status, MockAdminError)
        return cls(status, type_, message, body, method=method, path=path)
