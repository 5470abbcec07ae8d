"""The control plane: hand :class:`~ferry.RdmaMetadata` from the worker that
exposes memory to the worker that moves it, over NATS, HTTP or etcd.

The reference leaves this "secondary channel" to the application. Here the
exposing worker **publishes** its operation's metadata under a key both
workers know (the request id), and the other worker **fetches** it with a
deadline::

    # prefill (FERRY_SECRET set in both workers' environment)
    server = await ferry.control.HttpServer.bind("10.0.0.5:8700")
    with server.publish(request_id, readable.metadata()):
        await readable.wait_for_completion()

    # decode
    md = await ferry.control.fetch_http("10.0.0.5:8700", request_id, timeout=5)
    async with connector.begin_read(md, ferry.Descriptor(dst)) as read:
        await read.wait_for_completion()

The metadata is a capability. With the deployment's secret (``secret=``,
or ``FERRY_SECRET`` as for the connector), a fetch proves it holds the
secret, the publisher answers only such fetches, with the metadata
encrypted and authenticated for that one request, and a fetch refuses any
other answer and goes on waiting for the real one. Without a secret, a
server binds only loopback addresses and a NATS channel publishes only to a
server it reaches over loopback, unless the network is declared trusted
(``trusted_network=True`` or ``FERRY_CONTROL_TRUSTED_NETWORK=1``;
``PermissionError`` otherwise). ``token=`` (``FERRY_CONTROL_TOKEN``) makes
the HTTP server require ``Authorization: Bearer <token>``; NATS takes
``user``/``password``, ``token``, ``nkey`` or ``credentials`` (a file), or
``FERRY_NATS_USER``/``FERRY_NATS_PASSWORD``, ``FERRY_NATS_TOKEN``,
``FERRY_NATS_NKEY``, ``FERRY_NATS_CREDS``. See ``docs/security.md``, "The
control plane".

Over NATS, both sides use a :class:`NatsChannel` (request/reply on
``ferry.metadata.<key>``); the client reconnects by itself when the server
restarts. Through etcd (v3, its JSON gateway at ``http://host:2379``), both
sides use an :class:`EtcdStore`: the metadata is stored at
``/ferry/metadata/<key>`` on a lease the publisher keeps alive, deleted when
the publication is withdrawn and a lease TTL after a publisher dies; with a
secret the value stored is sealed, so etcd never holds it in clear. etcd
users: ``user``/``password``, or ``FERRY_ETCD_USER``/``FERRY_ETCD_PASSWORD``. A fetch asks again until its deadline while the key is not
published or the server is away, then raises the last cause:
:class:`MetadataNotFoundError`, :class:`NoServerError`,
:class:`ServerGoneError`, or :class:`TimeoutError`. Each call runs in the
event loop's default executor, without the GIL.
"""

from __future__ import annotations

import asyncio
import functools
from types import TracebackType
from typing import Callable, Optional, Type, TypeVar, Union

# The compiled core's control plane, which the classes below wrap.
from ._ferry import (
    DEFAULT_ETCD_PREFIX as _CORE_ETCD_PREFIX,
    DEFAULT_PREFIX as _CORE_PREFIX,
    EtcdStore as _CoreEtcdStore,
    HttpServer as _CoreHttpServer,
    Metadata as _CoreMetadata,
    NatsChannel as _CoreNatsChannel,
    Publication as _CorePublication,
    http_fetch as _core_http_fetch,
)
from ._errors import (
    AlreadyPublishedError,
    BadReplyError,
    ControlError,
    MetadataNotFoundError,
    MetadataRefusedError,
    NoServerError,
    ServerGoneError,
)
from ._metadata import RdmaMetadata

__all__ = [
    "DEFAULT_PREFIX",
    "Publication",
    "HttpServer",
    "NatsChannel",
    "DEFAULT_ETCD_PREFIX",
    "EtcdStore",
    "fetch_http",
    "ControlError",
    "MetadataNotFoundError",
    "NoServerError",
    "ServerGoneError",
    "BadReplyError",
    "MetadataRefusedError",
    "AlreadyPublishedError",
]

DEFAULT_PREFIX: str = _CORE_PREFIX
"""The NATS subject prefix unless told otherwise: key ``k`` is requested on
``ferry.metadata.k``."""

DEFAULT_ETCD_PREFIX: str = _CORE_ETCD_PREFIX
"""The etcd key prefix unless told otherwise: key ``k`` is stored at
``/ferry/metadata/k``."""

_T = TypeVar("_T")


async def _off_loop(fn: Callable[..., _T], *args: object) -> _T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args))


def _secret(secret: Union[str, bytes, None]) -> Optional[bytes]:
    if secret is None or isinstance(secret, bytes):
        return secret
    if isinstance(secret, str):
        return secret.encode()
    raise TypeError(f"secret must be str or bytes, not {type(secret).__name__}")


def _core(metadata: RdmaMetadata) -> _CoreMetadata:
    if not isinstance(metadata, RdmaMetadata):
        raise TypeError(f"metadata must be ferry.RdmaMetadata, not {type(metadata).__name__}")
    return metadata._core


class Publication:
    """Metadata published under a key, until :meth:`withdraw` (or the end of
    its ``with`` block, or garbage collection)."""

    __slots__ = ("_core",)

    def __init__(self, core: _CorePublication) -> None:
        self._core = core

    @property
    def key(self) -> str:
        return self._core.key

    @property
    def active(self) -> bool:
        """Whether it is still published."""
        return self._core.active

    def withdraw(self) -> None:
        """Withdraws the metadata; later fetches do not find it."""
        self._core.withdraw()

    def __enter__(self) -> Publication:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.withdraw()

    def __repr__(self) -> str:
        return f"Publication(key={self.key!r}, active={self.active})"


class HttpServer:
    """The exposing worker's HTTP server: ``GET /ferry/v1/metadata/<key>``
    answers the metadata published under ``key``, or 404. Plain HTTP/1.1:
    give it the deployment's secret to serve other hosts (see the module's
    documentation). It stops when :meth:`close` is called or it is garbage
    collected."""

    __slots__ = ("_core",)

    def __init__(self, core: _CoreHttpServer) -> None:
        self._core: Optional[_CoreHttpServer] = core

    @classmethod
    async def bind(
        cls,
        addr: str = "127.0.0.1:0",
        *,
        secret: Union[str, bytes, None] = None,
        token: Optional[str] = None,
        trusted_network: Optional[bool] = None,
    ) -> HttpServer:
        """Listens on ``addr`` (port 0: a free one). ``secret``, ``token``
        and ``trusted_network`` default to ``FERRY_SECRET``,
        ``FERRY_CONTROL_TOKEN`` and ``FERRY_CONTROL_TRUSTED_NETWORK=1``.
        Without a secret, an address other hosts can reach (``0.0.0.0``
        too) raises :class:`PermissionError` unless the network is
        declared trusted."""
        return cls(
            await _off_loop(
                _CoreHttpServer.bind, addr, _secret(secret), token, trusted_network
            )
        )

    def _server(self) -> _CoreHttpServer:
        if self._core is None:
            raise ControlError("this HttpServer is closed")
        return self._core

    @property
    def local_addr(self) -> str:
        """``host:port`` it listens on: what the other worker fetches from."""
        return self._server().local_addr

    def published(self) -> int:
        """How many keys are published now."""
        return self._server().published()

    def publish(self, key: str, metadata: RdmaMetadata) -> Publication:
        """Publishes ``metadata`` under ``key``. Raises
        :class:`AlreadyPublishedError` if the key is taken here."""
        return Publication(self._server().publish(key, _core(metadata)))

    def close(self) -> None:
        """Stops serving (publications are no longer reachable)."""
        self._core = None

    def __repr__(self) -> str:
        where = self._core.local_addr if self._core is not None else "closed"
        return f"HttpServer({where})"


async def fetch_http(
    endpoint: str,
    key: str,
    timeout: float = 10.0,
    *,
    secret: Union[str, bytes, None] = None,
    token: Optional[str] = None,
) -> RdmaMetadata:
    """The metadata published under ``key`` on the :class:`HttpServer` at
    ``endpoint`` (``host:port`` or ``http://host:port``), waiting up to
    ``timeout`` seconds for the server and the key. With a secret
    (``FERRY_SECRET`` by default), only metadata sealed with it for this
    fetch is accepted; ``token`` (``FERRY_CONTROL_TOKEN``) is sent as a
    bearer token."""
    core = await _off_loop(
        _core_http_fetch, endpoint, key, float(timeout), _secret(secret), token
    )
    return RdmaMetadata._wrap(core)


class NatsChannel:
    """One worker's connection to a NATS server, to publish metadata, fetch
    it, or both."""

    __slots__ = ("_core",)

    def __init__(self, core: _CoreNatsChannel) -> None:
        self._core = core

    @classmethod
    async def connect(
        cls,
        url: str,
        timeout: float = 10.0,
        prefix: str = DEFAULT_PREFIX,
        *,
        secret: Union[str, bytes, None] = None,
        trusted_network: Optional[bool] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        token: Optional[str] = None,
        nkey: Optional[str] = None,
        credentials: Optional[str] = None,
    ) -> NatsChannel:
        """Connects to ``url`` (``nats://host:4222``), waiting up to
        ``timeout`` seconds for the server. Both sides must use the same
        ``prefix`` (and the same secret). NATS credentials: ``user`` and
        ``password``, ``token``, ``nkey`` (a seed) or ``credentials`` (a
        file); each defaults to its ``FERRY_NATS_*`` variable."""
        return cls(
            await _off_loop(
                _CoreNatsChannel.connect,
                url,
                float(timeout),
                prefix,
                _secret(secret),
                trusted_network,
                user,
                password,
                token,
                nkey,
                credentials,
            )
        )

    async def publish(self, key: str, metadata: RdmaMetadata) -> Publication:
        """Answers requests for ``key`` with ``metadata`` until the
        publication is withdrawn."""
        return Publication(await _off_loop(self._core.publish, key, _core(metadata)))

    async def fetch(self, key: str, timeout: float = 10.0) -> RdmaMetadata:
        """The metadata published under ``key``, waiting up to ``timeout``
        seconds for a publisher (and for the server, if it is away)."""
        core = await _off_loop(self._core.fetch, key, float(timeout))
        return RdmaMetadata._wrap(core)


class EtcdStore:
    """One worker's client of an etcd cluster (v3, through its JSON
    gateway), to publish metadata, fetch it, or both. A key already in etcd
    is never overwritten (:class:`AlreadyPublishedError`)."""

    __slots__ = ("_core",)

    def __init__(self, core: _CoreEtcdStore) -> None:
        self._core = core

    @classmethod
    async def connect(
        cls,
        endpoints: str,
        timeout: float = 10.0,
        prefix: str = DEFAULT_ETCD_PREFIX,
        *,
        secret: Union[str, bytes, None] = None,
        trusted_network: Optional[bool] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        lease_ttl: Optional[float] = None,
    ) -> EtcdStore:
        """Connects to ``endpoints`` (``http://host:2379``, or a
        comma-separated list), waiting up to ``timeout`` seconds for etcd.
        Both sides must use the same ``prefix`` (``/ferry/<namespace>``)
        and the same secret. ``user`` and ``password`` default to
        ``FERRY_ETCD_USER`` and ``FERRY_ETCD_PASSWORD``; ``lease_ttl``
        (seconds, default 10) is how long metadata outlives a publisher
        that died. Without a secret, publishing needs an etcd reached over
        loopback or a network declared trusted (:class:`PermissionError`)."""
        return cls(
            await _off_loop(
                _CoreEtcdStore.connect,
                endpoints,
                float(timeout),
                prefix,
                _secret(secret),
                trusted_network,
                user,
                password,
                None if lease_ttl is None else float(lease_ttl),
            )
        )

    def etcd_key(self, key: str) -> str:
        """The etcd key that metadata for ``key`` is stored at."""
        return self._core.etcd_key(key)

    async def publish(self, key: str, metadata: RdmaMetadata) -> Publication:
        """Stores ``metadata`` under ``key`` until the publication is
        withdrawn (its :meth:`Publication.withdraw` deletes it in the
        background; :meth:`withdraw` waits until etcd has)."""
        return Publication(await _off_loop(self._core.publish, key, _core(metadata)))

    async def withdraw(self, publication: Publication) -> None:
        """Withdraws ``publication`` and waits until etcd has deleted it:
        later fetches raise :class:`MetadataNotFoundError`."""
        await _off_loop(self._core.withdraw, publication._core)

    async def fetch(self, key: str, timeout: float = 10.0) -> RdmaMetadata:
        """The metadata stored under ``key``, waiting up to ``timeout``
        seconds for it (and for etcd, if it is away)."""
        core = await _off_loop(self._core.fetch, key, float(timeout))
        return RdmaMetadata._wrap(core)

    async def publish_bytes(self, key: str, value: bytes) -> Publication:
        """:meth:`publish` for any value of at most 4 MiB (another
        component's metadata: a NIXL agent's, say), sealed the same way
        with a secret."""
        return Publication(await _off_loop(self._core.publish_bytes, key, bytes(value)))

    async def fetch_bytes(self, key: str, timeout: float = 10.0) -> bytes:
        """:meth:`fetch` of what :meth:`publish_bytes` stored, as given."""
        return await _off_loop(self._core.fetch_bytes, key, float(timeout))
