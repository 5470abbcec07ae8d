"""NIXL's Python agent API (``nixl._api``) on Ferry: code written for NIXL
runs with ``from nixl._api import nixl_agent, nixl_agent_config`` changed to
``from ferry.nixl._api import nixl_agent, nixl_agent_config``.

Each registered region is offered, through Ferry, to any agent that loads
this agent's metadata (``add_remote_agent`` claims the offers: a standing
grant each, bound to the claiming agent); a transfer is one-sided byte-range
reads or writes on those grants, with NIXL's notification after the bytes
landed. Ferry's lanes (cross-memory attach on one host, UCX, TCP, CUDA IPC)
stand in for NIXL's backends: whatever backend names the configuration
lists, Ferry picks the lane. See ``docs/nixl.md`` for the differences.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ._agent import AgentCore, name_arg
from ._descs import NIXL_MEMS, to_dlist
from ._dlist import loads, nixlRegDList, nixlRemoteDList, nixlXferDList, nixlXferTelemetry
from ._engine import Engine
from ._listen import Listener, bound_port, exchange
from ._notify import message_arg
from ._status import (
    DEFAULT_COMM_PORT,
    NIXL_INIT_AGENT,
    nixl_thread_sync_t,
    nixl_xfer_op_t,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotSupportedError,
)
from ._central import DEFAULT_LABEL, Central, from_env
from .logging import get_logger

__all__ = [
    "DEFAULT_COMM_PORT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_backend_handle",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]

logger = get_logger(__name__)

PLUGINS = ["UCX", "LIBFABRIC", "FERRY"]
"""The backend names an agent accepts: each stands for Ferry's lanes."""
_MEM_TYPES = ["DRAM_SEG", "VRAM_SEG"]

nixl_backend_handle = int
"""A backend's handle (an int, as NIXL's)."""

EngineFactory = Callable[[str, "nixl_agent_config"], Engine]


class nixl_prepped_dlist_handle:
    """A prepared descriptor list (``prep_xfer_dlist``). ``release()`` (or
    ``nixl_agent.release_dlist_handle``) frees it; so does its drop."""

    __slots__ = ("_handle", "_agent", "_released")

    def __init__(self, agent: AgentCore, value: int) -> None:
        self._handle = int(value)
        self._agent = agent
        self._released = False

    def __repr__(self) -> str:
        return f"nixl_prepped_dlist_handle(0x{self._handle:x}, released={self._released})"

    def release(self) -> None:
        if not self._released:
            self._agent.release_dlist(self._handle)
            self._released = True

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


class nixl_xfer_handle:
    """A transfer request (``initialize_xfer`` / ``make_prepped_xfer``).
    ``release()`` frees it; released while in flight, it is cancelled and
    waited for (at most 2 s) first, so that no byte moves after it returns
    (``nixlBackendError``, and the handle is kept, if it is still in flight
    then). Its drop releases it, or leaves it to the agent if it is in
    flight."""

    __slots__ = ("_handle", "_agent", "_released", "__weakref__")

    def __init__(self, agent: AgentCore, value: int) -> None:
        self._handle = int(value)
        self._agent = agent
        self._released = False

    def __repr__(self) -> str:
        return f"nixl_xfer_handle(0x{self._handle:x}, released={self._released})"

    def release(self) -> None:
        if not self._released:
            self._agent.release_xfer(self._handle)
            self._released = True

    def __del__(self) -> None:
        if self._released:
            return
        req = self._agent.xfers.get(self._handle)
        if req is not None and req.pending is not None and not req.pending.done():
            # Still in flight: the agent keeps the request (and with it the
            # transfer) until it ends; never a wait in a finalizer.
            return
        try:
            self._agent.release_xfer(self._handle)
        except Exception:
            pass


class nixl_agent_config:
    """An agent's configuration, NIXL's: positional or keyword
    ``enable_prog_thread``, ``enable_listen_thread``, ``listen_port``,
    ``capture_telemetry``, ``num_threads``, ``backends``, ``sync_mode``.

    With ``enable_listen_thread`` the agent listens on ``listen_port`` (0:
    any) for peers' ``send_local_metadata`` / ``fetch_remote_metadata``.
    ``backends`` names NIXL backends; Ferry's lanes stand in for all of
    them. ``enable_prog_thread``, ``num_threads`` and ``sync_mode`` are kept
    and not needed (Ferry's runtime makes progress by itself; the agent is
    thread safe)."""

    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = DEFAULT_COMM_PORT,
        capture_telemetry: bool = False,
        num_threads: int = 0,
        backends: Optional[List[str]] = None,
        sync_mode: Optional[nixl_thread_sync_t] = None,
    ) -> None:
        self.backends: List[str] = ["UCX"] if backends is None else list(backends)
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.sync_mode = sync_mode


def _telemetry_on(conf: nixl_agent_config) -> bool:
    env = os.environ.get("NIXL_TELEMETRY_ENABLE")
    if env is not None:
        return env.strip().lower() in ("y", "yes", "1", "true", "on")
    return bool(conf.capture_telemetry)


def _default_engine(name: str, conf: nixl_agent_config) -> Engine:
    from ._ferry_engine import FerryEngine

    return FerryEngine(name)


def _op(operation: str) -> bool:
    """Whether `operation` is a WRITE (``KeyError`` unless READ or WRITE,
    as NIXL)."""
    return {"READ": nixl_xfer_op_t.NIXL_READ, "WRITE": nixl_xfer_op_t.NIXL_WRITE}[operation] == nixl_xfer_op_t.NIXL_WRITE


class nixl_agent:
    """NIXL's agent (see the module): ``nixl_agent(name, nixl_agent_config(...))``.

    `engine` (keyword only, Ferry's) makes the agent over another engine: a
    callable ``(name, config) -> Engine`` (the tests' in-process one)."""

    def __init__(
        self,
        agent_name: str,
        nixl_conf: Optional[nixl_agent_config] = None,
        instantiate_all: bool = False,
        *,
        engine: Optional[EngineFactory] = None,
    ) -> None:
        if not isinstance(agent_name, str):
            raise TypeError(f"an agent name is a str, not {type(agent_name).__name__}")
        if not agent_name:
            raise ValueError("Agent needs a non-empty name")
        if len(agent_name.encode()) > 200:
            raise ValueError("an agent name is at most 200 bytes (it is Ferry's worker id)")
        if nixl_conf and instantiate_all:
            instantiate_all = False
            logger.warning("Ignoring instantiate_all based on the provided config in agent creation.")
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self._conf = conf
        self._leaked_xfer_handles: List[int] = []
        self.notifs: Dict[str, List[bytes]] = {}
        self.backends: Dict[str, int] = {}
        self.backend_mems: Dict[str, List[str]] = {}
        self.backend_options: Dict[str, Dict[str, str]] = {}
        self.plugin_list = list(PLUGINS)
        self.plugin_b_options: Dict[str, Dict[str, str]] = {}
        self.plugin_mem_types: Dict[str, List[str]] = {}
        self.nixl_mems = dict(NIXL_MEMS)
        self.nixl_ops = {"WRITE": nixl_xfer_op_t.NIXL_WRITE, "READ": nixl_xfer_op_t.NIXL_READ}
        self._core = AgentCore(agent_name, (engine or _default_engine)(agent_name, conf), _telemetry_on(conf))
        self.agent = self._core
        for b in self.plugin_list if instantiate_all else conf.backends:
            if b not in self.plugin_list:
                logger.warning("Skipping backend registration %s due to the missing plugin.", b)
            else:
                self.create_backend(b)
        self._listener: Optional[Listener] = None
        if conf.enable_listen:
            self._listener = Listener(self._core, int(conf.port))
        # NIXL's central metadata store (etcd), as NIXL reads it: from the
        # environment when the agent is made.
        self._central: Optional[Central] = from_env()

    @property
    def listen_port(self) -> Optional[int]:
        """Ferry's: the port the metadata listener took (``listen_port=0``
        asks for any), or ``None`` without one."""
        return bound_port(self._listener)

    def get_listen_port(self) -> int:
        """The port the metadata listener took (``listen_port=0`` in the
        configuration asks for any free one). :class:`nixlNotAllowedError`
        without a listener (``enable_listen_thread`` off)."""
        port = bound_port(self._listener)
        if port is None:
            raise nixlNotAllowedError("the agent has no metadata listener: enable_listen_thread is off")
        return port

    def close(self) -> None:
        """Ferry's: revokes every offer of the agent, forgets the remote
        agents and stops (NIXL's agent does it at destruction; so does
        this one's drop)."""
        if self._listener is not None:
            self._listener.close()
        if self._central is not None:
            self._central.close()
        self._core.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---- plugins and backends (Ferry's lanes stand in for all) ----

    def get_plugin_list(self) -> List[str]:
        return self.plugin_list

    def get_plugin_mem_types(self, backend: str) -> List[str]:
        if backend not in self.plugin_list:
            logger.warning("Plugin %s is not available to get its supported mem types.", backend)
            return []
        return list(_MEM_TYPES)

    def get_plugin_params(self, backend: str) -> Dict[str, str]:
        if backend not in self.plugin_list:
            logger.warning("Plugin %s is not available to get its parameters.", backend)
            return {}
        return {}

    def get_backend_mem_types(self, backend: str) -> List[str]:
        if backend not in self.backend_mems:
            logger.warning("Backend %s not instantiated to get its supported mem types.", backend)
            return []
        return self.backend_mems[backend]

    def get_backend_params(self, backend: str) -> Dict[str, str]:
        if backend not in self.backend_options:
            logger.warning("Backend %s not instantiated to get its parameters.", backend)
            return {}
        return self.backend_options[backend]

    def create_backend(self, backend: str, initParams: Optional[Dict[str, str]] = None) -> None:
        if backend not in self.plugin_list:
            raise nixlNotFoundError(f"unsupported backend {backend!r}: Ferry's lanes stand for {self.plugin_list}")
        self.backends[backend] = len(self.backends) + 1
        self.backend_mems[backend] = list(_MEM_TYPES)
        self.backend_options[backend] = dict(initParams or {})

    def _backends(self, backends: Optional[List[str]]) -> None:
        for b in backends or []:
            self.backends[b]  # KeyError for one not created, as NIXL

    # ---- registration ----

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None) -> Optional[nixlRegDList]:
        return to_dlist(nixlRegDList, descs, mem_type)

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None) -> Optional[nixlXferDList]:
        return to_dlist(nixlXferDList, descs, mem_type)

    def get_remote_descs(self, descs: Any, mem_type: Optional[str] = None) -> Optional[nixlRemoteDList]:
        if isinstance(descs, nixlRemoteDList):
            return descs
        if isinstance(descs, (list, tuple)) and descs and isinstance(descs[0], tuple):
            if mem_type is None:
                logger.error("Please specify a mem type")
                return None
            if len(descs[0]) != 4:
                logger.error("4-tuple list (addr, len, dev_id, agent_name) needed for remote descriptors")
                return None
            return nixlRemoteDList(self.nixl_mems[mem_type], list(descs))
        return None

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None, backends: Optional[List[str]] = None) -> nixlRegDList:
        self._backends(backends)
        reg = self.get_reg_descs(reg_list, mem_type)
        if reg is None:
            raise nixlNotSupportedError("nothing to register: the descriptors are not a registration list")
        self._core.register(reg)
        return reg

    def deregister_memory(self, dereg_list: nixlRegDList, backends: Optional[List[str]] = None) -> None:
        self._backends(backends)
        self._core.deregister(dereg_list)

    def query_memory(self, reg_list: Any, backend: str, mem_type: Optional[str] = None) -> List[Optional[Dict[str, str]]]:
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: {list(self.backends.keys())}")
        raise nixlNotSupportedError("Ferry's lanes move memory; they do not query storage")

    def make_connection(self, remote_agent: str, backends: Optional[List[str]] = None) -> None:
        self._backends(backends)
        with self._core.lock:
            self._core._remote(name_arg(remote_agent))

    # ---- transfers ----

    def prep_xfer_dlist(
        self, agent_name: Union[str, bytes], xfer_list: Any, mem_type: Optional[str] = None, backends: Optional[List[str]] = None
    ) -> nixl_prepped_dlist_handle:
        self._backends(backends)
        name = name_arg(agent_name)
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlNotFoundError("the descriptors are not a transfer list (see get_xfer_descs)")
        local = name in ("", NIXL_INIT_AGENT, "NIXL_INIT_AGENT")
        return nixl_prepped_dlist_handle(self._core, self._core.prep(None if local else name, descs))

    def make_prepped_xfer(
        self,
        operation: str,
        local_xfer_side: nixl_prepped_dlist_handle,
        local_indices: Any,
        remote_xfer_side: nixl_prepped_dlist_handle,
        remote_indices: Any,
        notif_msg: Union[bytes, str] = b"",
        backends: Optional[List[str]] = None,
        skip_desc_merge: bool = False,
    ) -> nixl_xfer_handle:
        write = _op(operation)
        self._backends(backends)
        lh = local_xfer_side._handle if isinstance(local_xfer_side, nixl_prepped_dlist_handle) else -1
        rh = remote_xfer_side._handle if isinstance(remote_xfer_side, nixl_prepped_dlist_handle) else -1
        i = self._core.make(write, lh, local_indices, rh, remote_indices, message_arg(notif_msg))
        return nixl_xfer_handle(self._core, i)

    def initialize_xfer(
        self,
        operation: str,
        local_descs: nixlXferDList,
        remote_descs: nixlXferDList,
        remote_agent: Union[str, bytes],
        notif_msg: Union[bytes, str] = b"",
        backends: Optional[List[str]] = None,
    ) -> nixl_xfer_handle:
        write = _op(operation)
        self._backends(backends)
        for d in (local_descs, remote_descs):
            if not isinstance(d, nixlXferDList):
                raise TypeError(f"initialize_xfer takes nixlXferDList (get_xfer_descs), not {type(d).__name__}")
        i = self._core.initialize(write, local_descs, remote_descs, name_arg(remote_agent), message_arg(notif_msg))
        return nixl_xfer_handle(self._core, i)

    def transfer(self, handle: nixl_xfer_handle, notif_msg: Union[bytes, str] = b"") -> str:
        """Posts the transfer: ``"DONE"`` if it completed in the call,
        ``"PROC"`` while in progress, ``"ERR"`` if it failed. Posting again
        while in progress raises ``nixlRepostActiveError``; a handle whose
        remote agent was removed, ``nixlNotFoundError`` (as NIXL)."""
        return self._core.post(handle._handle, message_arg(notif_msg) if notif_msg else None)

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        return self._core.req(handle._handle).state()

    def get_xfer_error(self, handle: nixl_xfer_handle) -> Optional[BaseException]:
        """Ferry's: why the transfer ended ``"ERR"`` (an exception; ``None``
        if it did not)."""
        return self._core.req(handle._handle).error()

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> Tuple[int, int, str]:
        self._core.req(req_handle._handle)
        return 0, 0, "UNKNOWN"

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> nixlXferTelemetry:
        if not self._core.telemetry:
            raise nixlNoTelemetryError("cannot return values when telemetry is not enabled")
        req = self._core.req(handle._handle)
        start_us, post_ns, xfer_ns = req.times()
        t = nixlXferTelemetry()
        t.startTime = start_us
        t.postDuration = max(post_ns // 1000, 1)
        t.xferDuration = max(xfer_ns // 1000, t.postDuration) if xfer_ns is not None else 0
        t.totalBytes = req.total
        t.descCount = req.pieces
        return t

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        self._core.req(handle._handle)
        return next(iter(self.backends), "FERRY")

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        handle.release()

    def prep_mem_view(self, dlist: Any, *, backends: Optional[List[str]] = None) -> int:
        raise nixlNotSupportedError("Ferry has no memory views (UCX's GPU device API)")

    def release_mem_view(self, mvh: int) -> None:
        raise nixlNotSupportedError("Ferry has no memory views (UCX's GPU device API)")

    # ---- notifications ----

    def get_new_notifs(self, backends: Optional[List[str]] = None) -> Dict[str, List[bytes]]:
        self._backends(backends)
        return self._core.notifs()

    def update_notifs(self, backends: Optional[List[str]] = None) -> Dict[str, List[bytes]]:
        for agent, msgs in self.get_new_notifs(backends).items():
            self.notifs.setdefault(agent, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(
        self, remote_agent_name: str, lookup_tag: bytes, backends: Optional[List[str]] = None, tag_is_prefix: bool = True
    ) -> bool:
        self.update_notifs(backends)
        msgs = self.notifs.get(name_arg(remote_agent_name), [])
        for m in msgs:
            if (tag_is_prefix and m.startswith(lookup_tag)) or (not tag_is_prefix and lookup_tag in m):
                msgs.remove(m)
                return True
        return False

    def send_notif(self, remote_agent_name: Union[str, bytes], notif_msg: Union[bytes, str], backend: Optional[str] = None) -> None:
        if backend is not None:
            self.backends[backend]
        self._core.send(name_arg(remote_agent_name), message_arg(notif_msg))

    # ---- metadata ----

    def get_agent_metadata(self) -> bytes:
        return self._core.metadata()

    def get_partial_agent_metadata(self, descs: nixlRegDList, inc_conn_info: bool = False, backends: Optional[List[str]] = None) -> bytes:
        self._backends(backends)
        return self._core.partial_metadata(descs, inc_conn_info)

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Loads a remote agent's metadata and claims its offers; returns
        its name, as bytes (as NIXL)."""
        return self._core.load(metadata)

    def remove_remote_agent(self, agent: Union[str, bytes]) -> None:
        self._core.remove(name_arg(agent))

    def check_remote_metadata(self, agent: Union[str, bytes], descs: Optional[nixlXferDList] = None) -> bool:
        return self._core.check_remote(name_arg(agent), descs)

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """To the agent listening at `ip_addr`:`port`, or with no address,
        to the central store (``NIXL_ETCD_ENDPOINTS``; see
        ``ferry.nixl._central``)."""
        if not ip_addr and self._central is not None:
            self._central.send(self.name, DEFAULT_LABEL, self._core.metadata())
            return
        exchange(self._core, "send", ip_addr, port, self._core.metadata())

    def send_partial_agent_metadata(
        self,
        descs: nixlRegDList,
        inc_conn_info: bool = False,
        backends: Optional[List[str]] = None,
        ip_addr: str = "",
        port: int = DEFAULT_COMM_PORT,
        label: str = "",
    ) -> None:
        self._backends(backends)
        md = self._core.partial_metadata(descs, inc_conn_info)
        if not ip_addr and self._central is not None:
            self._central.send(self.name, label, md)
            return
        exchange(self._core, "send", ip_addr, port, md)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = "") -> None:
        """In the background, from the agent listening at `ip_addr`:`port`,
        or with no address, what `remote_agent` stored under `label` in the
        central store; ``check_remote_metadata`` says when it arrived."""
        name = name_arg(remote_agent)
        if not ip_addr and self._central is not None:
            self._central.fetch_later(name, label, self._core.load)
            return
        exchange(self._core, "fetch", ip_addr, port, name.encode())

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        if not ip_addr and self._central is not None:
            self._central.invalidate(self.name)
            return
        exchange(self._core, "invalidate", ip_addr, port, self.name.encode())

    # ---- serialized descriptor lists ----

    def get_serialized_descs(self, descs: Any) -> bytes:
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs: bytes) -> Any:
        """A list from :meth:`get_serialized_descs`. Unlike NIXL's (a plain
        ``pickle.loads``), it unpickles descriptor lists only: the bytes
        come from another process."""
        return loads(serialized_descs)
