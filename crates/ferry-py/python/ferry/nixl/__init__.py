"""NIXL's Python agent API on Ferry's standing grants.

Code written for NIXL runs with only its import changed::

    from nixl._api import nixl_agent, nixl_agent_config     # NIXL
    from ferry.nixl._api import nixl_agent, nixl_agent_config  # Ferry

and likewise ``nixl._bindings`` (descriptor lists, constants, exceptions),
``nixl._utils`` and ``nixl.logging`` become ``ferry.nixl._bindings``,
``ferry.nixl._utils`` and ``ferry.nixl.logging``. ``docs/nixl.md`` lists
the differences from NIXL. NumPy is needed, as for NIXL's API.
"""

from ._api import (
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)

__all__ = [
    "DEFAULT_COMM_PORT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_backend_handle",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]
