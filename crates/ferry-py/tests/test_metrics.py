"""connector.metrics(): the connector's counters as a dict (docs/metrics.md)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import run

import ferry
from ferry import Connector, Descriptor


def test_metrics_count_what_happened():
    async def main():
        a, b = Connector(listen="127.0.0.1:0"), Connector(listen="127.0.0.1:0")
        empty = b.metrics()
        assert empty["operations"] == [] and empty["errors"] == {}
        assert empty["in_flight"] == {"read": 0, "write": 0, "readable": 0, "writable": 0}
        assert empty["worker_id"] == b.name

        for _ in range(2):
            async with a.create_readable(Descriptor(bytearray(b"x" * 5000))) as readable:
                async with b.begin_read(readable.metadata(), Descriptor(bytearray(5000))) as read:
                    await asyncio.gather(read.wait_for_completion(), readable.wait_for_completion())
                    transport = read.transport

        # A writable cancelled by leaving its block, then a read of a
        # readable its owner cancelled: refused by the remote.
        with a.create_writable([Descriptor(bytearray(3))]) as writable:
            assert a.metrics()["in_flight"]["writable"] == 1
            assert a.metrics()["exposed_bytes"] == 3
        with await a.create_readable(Descriptor(bytearray(7))) as gone:
            meta = gone.metadata()
        async with b.begin_read(meta, Descriptor(bytearray(7))) as read:
            with pytest.raises(ferry.RejectedError):
                await read.wait_for_completion()

        mb = b.metrics()
        reads = [o for o in mb["operations"] if o["outcome"] == "complete"]
        assert reads == [
            {"kind": "read", "transport": transport, "outcome": "complete", "count": 2, "bytes": 10000}
        ]
        errored = [o for o in mb["operations"] if o["outcome"] == "errored"]
        assert [(o["kind"], o["count"], o["bytes"]) for o in errored] == [("read", 1, 7)]
        assert mb["rx_bytes"] == 10000 and mb["tx_bytes"] == 0
        assert mb["errors"] == {"rejected": 1}
        (d,) = [h for h in mb["durations"] if h["side"] == "active"]
        assert d["count"] == 2 and d["transport"] == transport
        assert d["buckets"][-1] == (None, 2)
        assert all(isinstance(bound, int) for bound, _ in d["buckets"][:-1])

        ma = a.metrics()
        counts = {(o["kind"], o["outcome"]): (o["count"], o["bytes"]) for o in ma["operations"]}
        assert counts == {
            ("readable", "complete"): (2, 10000),
            ("readable", "cancelled"): (1, 7),
            ("writable", "cancelled"): (1, 3),
        }
        assert ma["tx_bytes"] == 10000
        assert ma["exposed_bytes"] == 0
        assert ma["cuda_ipc_fallbacks"] == 0
        assert sum(ma["in_flight"].values()) == 0
        assert set(ma["connections"]) == {
            "inbound_opened", "inbound_closed", "outbound_opened", "outbound_closed", "open"
        }

    run(main())
