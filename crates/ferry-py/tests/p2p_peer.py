"""The second process of tests/test_vllm_p2p.py: exposes a region through a
FerryTransport, prints its metadata (hex), then checks the blocks the
test wrote: one JSON line of [local, remote] pairs in, "ok" or what
differs out."""

from __future__ import annotations

import json
import sys

import numpy as np

from ferry.vllm import FerryTransport

BLOCKS, BLOCK = 32, 4096


def main() -> None:
    mem = np.full((BLOCKS, BLOCK), 0xEE, dtype=np.uint8)
    t = FerryTransport("p2p-peer", memoryview(mem))
    print(t.get_agent_metadata().hex(), flush=True)
    pairs = json.loads(sys.stdin.readline())
    written = {remote for _, remote in pairs}
    bad = []
    for local, remote in pairs:
        want = (np.arange(BLOCK) + local * 7 + 5) % 251
        if not np.array_equal(mem[remote], want.astype(np.uint8)):
            bad.append(remote)
    bad += [i for i in range(BLOCKS) if i not in written and not (mem[i] == 0xEE).all()]
    print("ok" if not bad else f"blocks differ: {bad}", flush=True)
    t.close()


if __name__ == "__main__":
    main()
