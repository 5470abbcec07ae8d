"""``nixl.logging``: :func:`get_logger`, which NIXL's examples use. Ferry's
loggers are children of the ``ferry.nixl`` logger, with no handler of
their own (configure :mod:`logging` as usual)."""

from __future__ import annotations

import logging as _logging

__all__ = ["get_logger"]


def get_logger(name: str) -> _logging.Logger:
    """The logger `name`, under ``ferry.nixl``."""
    if name == "ferry.nixl" or name.startswith("ferry.nixl."):
        return _logging.getLogger(name)
    return _logging.getLogger(f"ferry.nixl.{name}")
