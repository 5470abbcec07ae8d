"""Registration with a :class:`Connection`, as the reference's descriptor
pools use it: what :class:`Descriptor` and :class:`PagedDescriptor` share."""

from __future__ import annotations

import threading
from typing import Any, Optional

from ._connection import Connection

# Guards the check-then-set of register/deregister_with_connector.
# Reentrant: an operation's finalizer releases its registrations, and the
# garbage collector may run one on a thread that holds this lock.
_registration_lock = threading.RLock()


class _Registrable:
    """The registration methods of a descriptor; its class sets ``_ptr``
    (0 for a null pointer, which cannot be registered)."""

    __slots__ = ("_connection", "_registration")

    _ptr: int
    _connection: Optional[Connection]
    # Identifies the current registration (a new object for each one), so
    # an operation releases only the registration it claimed.
    _registration: Optional[object]

    @property
    def is_registered(self) -> bool:
        """Whether :meth:`register_with_connector` recorded a connection."""
        return self._connection is not None

    def register_with_connector(self, connection: Connection) -> None:
        """Records `connection` (a :class:`Connection`, e.g. from
        ``await connector._create_connection()``) as the one this descriptor
        is registered with. Ferry exposes memory per operation and needs no
        registration; this keeps the reference's rules for code that pools
        descriptors: registering again with the same connection does
        nothing, with another one is a ``RuntimeError`` (deregister first),
        and a null pointer is a ``ValueError``."""
        _connection_arg(connection)
        if self._ptr == 0:
            raise ValueError("cannot register a descriptor with a null pointer")
        with _registration_lock:
            current = self._connection
            if current is None:
                self._connection = connection
                self._registration = object()
                return
        if current is not connection:
            raise RuntimeError(
                "a descriptor cannot be registered with more than one connection: it is "
                f"registered with {current.name!r}, not {connection.name!r} "
                "(deregister_with_connector it first)"
            )

    def deregister_with_connector(self, connection: Connection) -> None:
        """Forgets the registration with `connection`. A ``RuntimeError`` if
        the descriptor is not registered with that very connection (nor at
        all), as in the reference."""
        _connection_arg(connection)
        with _registration_lock:
            current = self._connection
            if current is connection:
                self._connection = None
                self._registration = None
                return
        raise RuntimeError(
            "a descriptor can only be deregistered from the connection it was registered "
            f"with: it is registered with {None if current is None else repr(current.name)}, "
            f"not {connection.name!r}"
        )

    def _claim_registration(self, connection: Connection) -> object:
        """What an operation made from `connection` does with each of its
        local descriptors, as the reference's operations register them:
        registers the descriptor with `connection` unless it already is
        (the rules of :meth:`register_with_connector`), and returns the
        registration now in place, for :meth:`_release_registration`."""
        self.register_with_connector(connection)
        with _registration_lock:
            token = self._registration
            if self._connection is connection and token is not None:
                return token
        # Deregistered by another thread in between: register again.
        return self._claim_registration(connection)

    def _release_registration(self, connection: Connection, token: object) -> None:
        """Deregisters the descriptor if the registration in place is still
        `token` (with `connection`): a registration made since (by hand, or
        by a newer operation) is left alone, and releasing twice does
        nothing."""
        with _registration_lock:
            if self._registration is token and self._connection is connection:
                self._connection = None
                self._registration = None


def _connection_arg(connection: Any) -> None:
    if not isinstance(connection, Connection):
        raise TypeError(
            f"connection must be a ferry.Connection (from `await connector._create_connection()` "
            f"or Connection(connector, number)), not {type(connection).__name__}"
        )
