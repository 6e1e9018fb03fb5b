"""loops-mock for Python tests: start the server binary, read its variables, drive its admin API.

    from loops_mock import start_server

    with start_server(["--clock", "virtual"]) as mock:
        mock.env            # LOOPS_BASE_URL, BASETEN_API_KEY, ...
        mock.admin.add_fault({"match": {"op": "optim_step"}, "action": {"type": "drop", "phase": "after"}, "times": 1})

With pytest, the plugin (installed with this package) gives the ``loops_mock``
and ``loops_env`` fixtures. Standard library only.
"""

from .admin import (
    LoopsMockError,
    MockAdmin,
    MockAdminBadRequest,
    MockAdminConflict,
    MockAdminConnectionError,
    MockAdminError,
    MockAdminNotFound,
    MockAdminUnauthorized,
)
from .server import BIN_ENV, BinaryNotFoundError, LoopsMock, ServerStartError, find_command, start_server

__version__ = "0.1.0"

__all__ = [
    "BIN_ENV",
    "BinaryNotFoundError",
    "LoopsMock",
    "LoopsMockError",
    "MockAdmin",
    "MockAdminBadRequest",
    "MockAdminConflict",
    "MockAdminConnectionError",
    "MockAdminError",
    "MockAdminNotFound",
    "MockAdminUnauthorized",
    "ServerStartError",
    "find_command",
    "start_server",
    "__version__",
]
