"""The connector: one worker's entry point, which creates the four
operations."""

from __future__ import annotations

from typing import Any, Callable, List, Type

from . import _ferry
from ._connection import _ConnectorBase
from ._metadata import RdmaMetadata
from ._operations import (
    Descriptors,
    PendingOperation,
    ReadableOperation,
    ReadOperation,
    WritableOperation,
    WriteOperation,
    _Op,
    _check_writable,
    _descriptor_list,
    _new_active,
    _read_args,
    _write_args,
)
from ._pool import AnyDescriptor


class Connector(_ConnectorBase):
    """One worker's entry point to Ferry: creates the four operations, owns
    the listener, the pooled connections to remote workers and the table of
    exposed memory.

    `worker_id` defaults to a random id. `listen` (``"ip:port"``, default
    ``"0.0.0.0:0"``: every interface, an ephemeral port) is where remote
    workers connect; the metadata carries this host's addresses.

    A connector belongs to no event loop: it can be created outside any,
    then used from several loops (asyncio's, uvloop) and threads at once.
    Connectors compare (and hash) by worker id.

    Operations keep their connector alive. When the connector is dropped
    with nothing else holding it, it shuts down.
    """

    __slots__ = ()

    def create_readable(self, local_descriptors: Descriptors) -> PendingOperation[ReadableOperation]:
        """Exposes `local_descriptors` for one remote worker to read; hand it
        the operation's ``metadata()``."""
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        return self._expose(ReadableOperation, descs, self._core.create_readable)

    def create_writable(self, local_descriptors: Descriptors) -> PendingOperation[WritableOperation]:
        """Exposes `local_descriptors` for one remote worker to write; hand
        it the operation's ``metadata()``."""
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        _check_writable(descs, "WritableOperation")
        return self._expose(WritableOperation, descs, self._core.create_writable)

    def begin_read(
        self, remote_metadata: RdmaMetadata, local_descriptors: Descriptors
    ) -> PendingOperation[ReadOperation]:
        """Starts reading the remote readable `remote_metadata` describes
        into `local_descriptors` (counts and sizes must match). The two
        arguments may also come the other way round. The metadata of a
        writable is a :class:`WrongPairingError`."""
        meta, descs = _read_args(remote_metadata, local_descriptors)
        raw = [d._raw for d in descs]
        return PendingOperation(
            self,
            lambda: self._core.begin_read(meta._core, raw),
            lambda: self._core.begin_read_blocking(meta._core, raw),
            lambda op, conn: _new_active(ReadOperation, op, descs, self, conn, meta),
        )

    def begin_write(
        self, local_descriptors: Descriptors, remote_metadata: RdmaMetadata
    ) -> PendingOperation[WriteOperation]:
        """Starts writing `local_descriptors` into the remote writable
        `remote_metadata` describes (counts and sizes must match). The two
        arguments may also come the other way round. The metadata of a
        readable is a :class:`WrongPairingError`."""
        descs, meta = _write_args(local_descriptors, remote_metadata)
        raw = [d._raw for d in descs]
        return PendingOperation(
            self,
            lambda: self._core.begin_write(raw, meta._core),
            lambda: self._core.begin_write_blocking(raw, meta._core),
            lambda op, conn: _new_active(WriteOperation, op, descs, self, conn, meta),
        )

    def _expose(
        self,
        cls: Type[_Op],
        descs: List[AnyDescriptor],
        create: Callable[[List[Any]], _ferry.Operation],
    ) -> PendingOperation[_Op]:
        raw = [d._raw for d in descs]
        return PendingOperation(
            self, None, lambda: create(raw), lambda op, conn: cls._new(op, descs, self, conn)
        )
