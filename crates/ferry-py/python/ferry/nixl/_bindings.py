"""The names NIXL's compiled ``nixl._bindings`` module has that code written
for NIXL imports: memory types (``DRAM_SEG``...), statuses
(``NIXL_SUCCESS``...), operations (``NIXL_READ``, ``NIXL_WRITE``), the
descriptor lists (:class:`nixlXferDList`, :class:`nixlRegDList`,
:class:`nixlRemoteDList`), :class:`nixlXferTelemetry` and the exceptions
(:class:`nixlNotFoundError`...). ``import nixl._bindings as nixl`` becomes
``import ferry.nixl._bindings as nixl``.

NIXL's low-level ``nixlAgent`` (the C++ agent the Python one wraps) is not
here: use :class:`ferry.nixl.nixl_agent`.
"""

from __future__ import annotations

from ._dlist import nixlRegDList, nixlRemoteDList, nixlXferDList, nixlXferTelemetry
from ._status import (
    DEFAULT_COMM_PORT,
    HAVE_UCX_GPU_DEVICE_API,
    NIXL_INIT_AGENT,
    nixl_cost_t,
    nixl_mem_t,
    nixl_status_t,
    nixl_thread_sync_t,
    nixl_xfer_op_t,
    nixlBackendError,
    nixlCancelledError,
    nixlError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlUnknownError,
)

DRAM_SEG = nixl_mem_t.DRAM_SEG
VRAM_SEG = nixl_mem_t.VRAM_SEG
BLK_SEG = nixl_mem_t.BLK_SEG
OBJ_SEG = nixl_mem_t.OBJ_SEG
FILE_SEG = nixl_mem_t.FILE_SEG

NIXL_SUCCESS = nixl_status_t.NIXL_SUCCESS
NIXL_IN_PROG = nixl_status_t.NIXL_IN_PROG
NIXL_ERR_NOT_POSTED = nixl_status_t.NIXL_ERR_NOT_POSTED
NIXL_ERR_INVALID_PARAM = nixl_status_t.NIXL_ERR_INVALID_PARAM
NIXL_ERR_BACKEND = nixl_status_t.NIXL_ERR_BACKEND
NIXL_ERR_NOT_FOUND = nixl_status_t.NIXL_ERR_NOT_FOUND
NIXL_ERR_MISMATCH = nixl_status_t.NIXL_ERR_MISMATCH
NIXL_ERR_NOT_ALLOWED = nixl_status_t.NIXL_ERR_NOT_ALLOWED
NIXL_ERR_REPOST_ACTIVE = nixl_status_t.NIXL_ERR_REPOST_ACTIVE
NIXL_ERR_UNKNOWN = nixl_status_t.NIXL_ERR_UNKNOWN
NIXL_ERR_NOT_SUPPORTED = nixl_status_t.NIXL_ERR_NOT_SUPPORTED

NIXL_READ = nixl_xfer_op_t.NIXL_READ
NIXL_WRITE = nixl_xfer_op_t.NIXL_WRITE

NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT

NIXL_COST_ANALYTICAL_BACKEND = nixl_cost_t.NIXL_COST_ANALYTICAL_BACKEND

__all__ = [
    "DEFAULT_COMM_PORT",
    "HAVE_UCX_GPU_DEVICE_API",
    "NIXL_INIT_AGENT",
    "DRAM_SEG",
    "VRAM_SEG",
    "BLK_SEG",
    "OBJ_SEG",
    "FILE_SEG",
    "NIXL_SUCCESS",
    "NIXL_IN_PROG",
    "NIXL_ERR_NOT_POSTED",
    "NIXL_ERR_INVALID_PARAM",
    "NIXL_ERR_BACKEND",
    "NIXL_ERR_NOT_FOUND",
    "NIXL_ERR_MISMATCH",
    "NIXL_ERR_NOT_ALLOWED",
    "NIXL_ERR_REPOST_ACTIVE",
    "NIXL_ERR_UNKNOWN",
    "NIXL_ERR_NOT_SUPPORTED",
    "NIXL_READ",
    "NIXL_WRITE",
    "NIXL_THREAD_SYNC_NONE",
    "NIXL_THREAD_SYNC_STRICT",
    "NIXL_THREAD_SYNC_RW",
    "NIXL_THREAD_SYNC_DEFAULT",
    "NIXL_COST_ANALYTICAL_BACKEND",
    "nixl_mem_t",
    "nixl_status_t",
    "nixl_xfer_op_t",
    "nixl_thread_sync_t",
    "nixl_cost_t",
    "nixlXferDList",
    "nixlRegDList",
    "nixlRemoteDList",
    "nixlXferTelemetry",
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
]
