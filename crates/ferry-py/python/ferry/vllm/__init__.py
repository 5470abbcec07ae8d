"""Ferry under vLLM's own interfaces.

:class:`FerryTransport` is vLLM's P2P offload data plane
(``vllm.v1.kv_offload.tiering.p2p.data.base.DataTransport``) on Ferry's
standing grants: see :mod:`ferry.vllm.p2p`.
"""

from .p2p import FerryTransport, PollResult, TransportError

__all__ = ["FerryTransport", "PollResult", "TransportError"]
