#!/usr/bin/env python3
"""NIXL's registered-once, re-posted transfer between two processes of this
host: the anchor that `ferry bench --workload grant` is read against.

Each side registers its host memory once; the initiator prepares one READ
and one WRITE per size and re-posts it, busy-polling `check_xfer_state`
(NIXL's own model). For writes the target busy-polls `get_new_notifs` and
stamps each notification's arrival with CLOCK_MONOTONIC, which both
processes of one host share, so post -> owner notification is measured too.

    python3 -m venv /tmp/nixl && /tmp/nixl/bin/pip install nixl-cu12   # 5.7 GB
    /tmp/nixl/bin/python scripts/peers/nixl_latency.py [--sizes 4096,65536] [--iters 2000]

Prints one JSON line per (op, size): p50/p99 in microseconds, GB/s, ops/s.
"""
import argparse
import json
import multiprocessing as mp
import time

import numpy as np

try:
    from nixl_cu12 import nixl_agent, nixl_agent_config
except ImportError:  # the CUDA-13 wheel or a source build
    from nixl._api import nixl_agent, nixl_agent_config


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def recv(conn, peer, timeout=60.0):
    """The peer's next message, or an error if it died or stayed silent."""
    if not conn.poll(timeout):
        raise SystemExit(f"the NIXL target sent nothing in {timeout} s (alive: {peer.is_alive()})")
    return conn.recv()


def target(conn, total):
    agent = nixl_agent("target", nixl_agent_config(backends=["UCX"]))
    buf = np.zeros(total, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, total, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    agent.add_remote_agent(conn.recv())
    conn.send("ready")
    arrivals = []
    while True:
        if conn.poll():
            msg = conn.recv()
            if msg == "stop":
                break
            if msg == "arrivals":
                conn.send(arrivals)
                arrivals = []
                continue
        notifs = agent.get_new_notifs()
        if notifs:
            now = time.monotonic_ns()
            for msgs in notifs.values():
                arrivals.extend((m, now) for m in msgs)


def run(op, agent, remote, size, addr_l, addr_r, iters, notify):
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(addr_l, size, 0)], "DRAM")
    far = agent.prep_xfer_dlist(remote, [(addr_r, size, 0)], "DRAM")
    h = agent.make_prepped_xfer(op, local, [0], far, [0], b"")
    lat, posts = [], []
    start = time.perf_counter()
    for i in range(iters):
        t0 = time.monotonic_ns()
        msg = f"{op}{size}:{i}".encode() if notify else b""
        state = agent.transfer(h, msg)
        while state != "DONE":
            if state == "ERR":
                raise RuntimeError(f"{op} {size}: transfer failed")
            state = agent.check_xfer_state(h)
        lat.append((time.monotonic_ns() - t0) / 1e3)
        posts.append((msg, t0))
    elapsed = time.perf_counter() - start
    agent.release_xfer_handle(h)
    return lat, posts, elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,65536,1048576,67108864")
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    total = max(sizes)
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    peer = ctx.Process(target=target, args=(theirs, total))
    peer.start()
    meta, addr_r = recv(mine, peer)
    agent = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
    buf = np.ones(total, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, total, 0, "")], "DRAM")
    remote = agent.add_remote_agent(meta)
    mine.send(agent.get_agent_metadata())
    assert recv(mine, peer) == "ready"
    for size in sizes:
        iters = max(20, min(args.iters, (1 << 30) // size))
        for op in ("READ", "WRITE"):
            run(op, agent, remote, size, buf.ctypes.data, addr_r, 10, False)  # warm
            notify = op == "WRITE"
            lat, posts, elapsed = run(op, agent, remote, size, buf.ctypes.data, addr_r, iters, notify)
            row = {
                "peer": "nixl", "version": "1.5.1", "op": op, "size": size, "iters": iters,
                "p50_us": round(pct(lat, 0.5), 2), "p99_us": round(pct(lat, 0.99), 2),
                "gbps": round(size * iters / elapsed / 1e9, 3),
                "ops_per_s": round(iters / elapsed),
            }
            if notify:
                time.sleep(0.2)
                mine.send("arrivals")
                seen = dict(recv(mine, peer))
                n = [(seen[m] - t0) / 1e3 for m, t0 in posts if m in seen]
                row["notif_seen"] = len(n)
                if n:
                    row["notif_p50_us"] = round(pct(n, 0.5), 2)
                    row["notif_p99_us"] = round(pct(n, 0.99), 2)
            print(json.dumps(row), flush=True)
    mine.send("stop")
    peer.join(10)


if __name__ == "__main__":
    main()
