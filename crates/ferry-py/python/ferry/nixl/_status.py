"""NIXL's enumerations, constants and exceptions, as ``nixl._bindings``
names them: memory types (:class:`nixl_mem_t`), statuses
(:class:`nixl_status_t`), operations (:class:`nixl_xfer_op_t`), thread
synchronization modes, and one exception class per error status
(:class:`nixlNotFoundError`, :class:`nixlInvalidParamError`...).

Where NIXL's message is the bare status name, Ferry's starts with it and
then says why (``"NIXL_ERR_NOT_FOUND: ... lies outside every region agent
'A' registered"``).
"""

from __future__ import annotations

import enum
from typing import Dict, Type

__all__ = [
    "DEFAULT_COMM_PORT",
    "NIXL_INIT_AGENT",
    "HAVE_UCX_GPU_DEVICE_API",
    "nixl_mem_t",
    "nixl_status_t",
    "nixl_xfer_op_t",
    "nixl_thread_sync_t",
    "nixl_cost_t",
    "nixlError",
    "nixlNotPostedError",
    "nixlInvalidParamError",
    "nixlBackendError",
    "nixlNotFoundError",
    "nixlMismatchError",
    "nixlNotAllowedError",
    "nixlRepostActiveError",
    "nixlUnknownError",
    "nixlNotSupportedError",
    "nixlRemoteDisconnectError",
    "nixlCancelledError",
    "nixlNoTelemetryError",
    "error_for",
]

DEFAULT_COMM_PORT = 8888
"""The port NIXL's metadata listener takes by default."""

NIXL_INIT_AGENT = ""
"""The agent name ``prep_xfer_dlist`` takes for the initiator's own side."""

HAVE_UCX_GPU_DEVICE_API = False
"""NIXL's probe for UCX's GPU device API (``prep_mem_view``): Ferry has no
memory views."""


class _NixlEnum(enum.IntEnum):
    """An int enum whose ``str`` is ``"type.NAME"``, as pybind11's are."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {int(self)}>"


class nixl_mem_t(_NixlEnum):
    """Where a descriptor's memory lives. Ferry moves ``DRAM_SEG`` (host
    memory) and ``VRAM_SEG`` (GPU memory, on the lanes that have it);
    storage types are refused at registration."""

    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


class nixl_status_t(_NixlEnum):
    """NIXL's status codes."""

    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9


class nixl_xfer_op_t(_NixlEnum):
    """A transfer's direction, from the initiator's side."""

    NIXL_READ = 0
    NIXL_WRITE = 1


class nixl_thread_sync_t(_NixlEnum):
    """NIXL's thread synchronization modes. Ferry's agent is safe to call
    from several threads in every mode; the mode is kept, not used."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class nixl_cost_t(_NixlEnum):
    """How a cost estimate was made."""

    NIXL_COST_ANALYTICAL_BACKEND = 0


class nixlError(Exception):
    """The base of Ferry's NIXL exceptions (NIXL's own have none but
    ``Exception``)."""

    status = nixl_status_t.NIXL_ERR_UNKNOWN

    def __init__(self, why: str = "") -> None:
        name = self.status.name
        super().__init__(f"{name}: {why}" if why else name)


class nixlNotPostedError(nixlError):
    """NIXL_ERR_NOT_POSTED: the transfer was never posted."""

    status = nixl_status_t.NIXL_ERR_NOT_POSTED


class nixlInvalidParamError(nixlError):
    """NIXL_ERR_INVALID_PARAM: an argument is wrong (counts or lengths that
    differ, an index out of range, a handle of another kind)."""

    status = nixl_status_t.NIXL_ERR_INVALID_PARAM


class nixlBackendError(nixlError):
    """NIXL_ERR_BACKEND: the lane failed (Ferry's own exception is the
    ``__cause__``)."""

    status = nixl_status_t.NIXL_ERR_BACKEND


class nixlNotFoundError(nixlError):
    """NIXL_ERR_NOT_FOUND: no such agent, descriptor or registration
    (memory outside every registered region, an agent not added or
    removed)."""

    status = nixl_status_t.NIXL_ERR_NOT_FOUND


class nixlMismatchError(nixlError):
    """NIXL_ERR_MISMATCH: metadata that is not an agent's."""

    status = nixl_status_t.NIXL_ERR_MISMATCH


class nixlNotAllowedError(nixlError):
    """NIXL_ERR_NOT_ALLOWED: the call is not allowed now (a revoked or
    deregistered region, a released handle)."""

    status = nixl_status_t.NIXL_ERR_NOT_ALLOWED


class nixlRepostActiveError(nixlError):
    """NIXL_ERR_REPOST_ACTIVE: the transfer is still in progress."""

    status = nixl_status_t.NIXL_ERR_REPOST_ACTIVE


class nixlUnknownError(nixlError):
    """NIXL_ERR_UNKNOWN."""

    status = nixl_status_t.NIXL_ERR_UNKNOWN


class nixlNotSupportedError(nixlError):
    """NIXL_ERR_NOT_SUPPORTED: not something Ferry does (storage memory
    types, memory views, a central metadata store without its
    configuration)."""

    status = nixl_status_t.NIXL_ERR_NOT_SUPPORTED


class nixlRemoteDisconnectError(nixlError):
    """The remote agent went away."""

    status = nixl_status_t.NIXL_ERR_BACKEND


class nixlCancelledError(nixlError):
    """The transfer was cancelled."""

    status = nixl_status_t.NIXL_ERR_BACKEND


class nixlNoTelemetryError(nixlError):
    """Telemetry was not enabled (``capture_telemetry=True`` or
    ``NIXL_TELEMETRY_ENABLE``)."""

    status = nixl_status_t.NIXL_ERR_NOT_ALLOWED

    def __init__(self, why: str = "") -> None:
        Exception.__init__(self, f"NIXL_ERR_NO_TELEMETRY: {why}" if why else "NIXL_ERR_NO_TELEMETRY")


_BY_STATUS: Dict[nixl_status_t, Type[nixlError]] = {
    nixl_status_t.NIXL_ERR_NOT_POSTED: nixlNotPostedError,
    nixl_status_t.NIXL_ERR_INVALID_PARAM: nixlInvalidParamError,
    nixl_status_t.NIXL_ERR_BACKEND: nixlBackendError,
    nixl_status_t.NIXL_ERR_NOT_FOUND: nixlNotFoundError,
    nixl_status_t.NIXL_ERR_MISMATCH: nixlMismatchError,
    nixl_status_t.NIXL_ERR_NOT_ALLOWED: nixlNotAllowedError,
    nixl_status_t.NIXL_ERR_REPOST_ACTIVE: nixlRepostActiveError,
    nixl_status_t.NIXL_ERR_UNKNOWN: nixlUnknownError,
    nixl_status_t.NIXL_ERR_NOT_SUPPORTED: nixlNotSupportedError,
}


def error_for(status: nixl_status_t, why: str = "") -> nixlError:
    """The exception NIXL raises for `status`."""
    return _BY_STATUS.get(status, nixlUnknownError)(why)
