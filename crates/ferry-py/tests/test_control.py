"""ferry.control: metadata handed over HTTP (the real server on loopback)
and NATS (a real nats-server started on a free port; skipped, with the
reason, when it is not installed), in one process and across two."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import pytest

import ferry
from ferry import control


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nats:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: "subprocess.Popen[bytes] | None" = None
        self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def nats() -> Iterator[Nats]:
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server is not installed (Debian: apt-get install nats-server)")
    n = Nats()
    yield n
    n.stop()



async def read_all(c: ferry.Connector, md: ferry.RdmaMetadata, n: int) -> bytearray:
    dst = bytearray(n)
    async with c.begin_read(md, ferry.Descriptor(dst)) as read:
        await read.wait_for_completion()
    return dst


def test_http_round_trip_and_errors() -> None:
    async def main() -> None:
        prefill = ferry.Connector(listen="127.0.0.1:0")
        decode = ferry.Connector(listen="127.0.0.1:0")
        server = await control.HttpServer.bind("127.0.0.1:0")
        data = bytes(range(256)) * 64
        with await prefill.create_readable(ferry.Descriptor(data)) as readable:
            with server.publish("req-1", readable.metadata()) as pub:
                assert pub.key == "req-1" and pub.active and server.published() == 1
                md = await control.fetch_http(f"http://{server.local_addr}", "req-1", timeout=5)
                assert md.to_json() == readable.metadata().to_json()
                assert await read_all(decode, md, len(data)) == data
                await readable.wait_for_completion()
                with pytest.raises(control.AlreadyPublishedError):
                    server.publish("req-1", readable.metadata())
            assert not pub.active and server.published() == 0
        t = time.monotonic()
        with pytest.raises(control.MetadataNotFoundError) as e:
            await control.fetch_http(server.local_addr, "req-1", timeout=0.3)
        assert isinstance(e.value, LookupError) and time.monotonic() - t < 2
        with pytest.raises(ValueError):
            await control.fetch_http(server.local_addr, "a/b", timeout=1)
        with pytest.raises(ValueError):
            await control.fetch_http(server.local_addr, "k", timeout=-1)
        with pytest.raises(control.NoServerError) as no:
            await control.fetch_http(f"127.0.0.1:{free_port()}", "k", timeout=0.3)
        assert isinstance(no.value, ConnectionError)
        with pytest.raises(TypeError):
            server.publish("k", "not metadata")  # type: ignore[arg-type]
        server.close()
        with pytest.raises(control.ControlError):
            server.publish("k", md)

    asyncio.run(main())


SECRET = "0123456789abcdef0123456789abcdef"


def test_http_secret_token_and_the_loopback_rule() -> None:
    async def main() -> None:
        # Without a secret, an address other hosts reach is refused.
        with pytest.raises(PermissionError, match="FERRY_CONTROL_TRUSTED_NETWORK"):
            await control.HttpServer.bind("0.0.0.0:0", trusted_network=False)
        prefill = ferry.Connector(listen="127.0.0.1:0")
        decode = ferry.Connector(listen="127.0.0.1:0")
        server = await control.HttpServer.bind("0.0.0.0:0", secret=SECRET, token="tok-1")
        where = "127.0.0.1:" + server.local_addr.rsplit(":", 1)[1]
        data = bytes(range(256)) * 16
        with await prefill.create_readable(ferry.Descriptor(data)) as readable:
            with server.publish("req-1", readable.metadata()):
                with pytest.raises(control.ControlError):  # no token
                    await control.fetch_http(where, "req-1", timeout=0.5, secret=SECRET)
                with pytest.raises(control.ControlError):  # no secret
                    await control.fetch_http(where, "req-1", timeout=0.5, token="tok-1")
                md = await control.fetch_http(
                    where, "req-1", timeout=5, secret=SECRET.encode(), token="tok-1"
                )
                assert md.to_json() == readable.metadata().to_json()
                assert await read_all(decode, md, len(data)) == data
                await readable.wait_for_completion()
        server.close()

    asyncio.run(main())


def test_nats_round_trip_restart_and_server_gone(nats: Nats) -> None:
    async def main() -> None:
        prefill = ferry.Connector(listen="127.0.0.1:0")
        decode = ferry.Connector(listen="127.0.0.1:0")
        pub_side = await control.NatsChannel.connect(nats.url, timeout=5)
        fetch_side = await control.NatsChannel.connect(nats.url, timeout=5)
        data = b"kv" * 5000
        readable = await prefill.create_readable(ferry.Descriptor(data))
        with await pub_side.publish("before", readable.metadata()):
            md = await fetch_side.fetch("before", timeout=5)
            assert await read_all(decode, md, len(data)) == data
            with pytest.raises(control.MetadataNotFoundError):
                await fetch_side.fetch("nobody", timeout=0.3)

            nats.stop()
            nats.start()
            second = await prefill.create_readable(ferry.Descriptor(data))
            with await pub_side.publish("after", second.metadata()):
                md2 = await fetch_side.fetch("after", timeout=10)
                assert await read_all(decode, md2, len(data)) == data

            nats.stop()
            t = time.monotonic()
            with pytest.raises((control.ServerGoneError, TimeoutError)):
                await fetch_side.fetch("before", timeout=1)
            assert time.monotonic() - t < 3
        with pytest.raises(control.NoServerError):
            await control.NatsChannel.connect(nats.url, timeout=0.3)
        with pytest.raises(ValueError):
            await control.NatsChannel.connect(nats.url, timeout=1, prefix="bad..prefix")

    asyncio.run(main())


PREFILL = textwrap.dedent(
    """
    import asyncio, sys
    import ferry
    from ferry import control

    async def main(via, where):
        c = ferry.Connector(listen="127.0.0.1:0")
        with await c.create_readable(ferry.Descriptor(b"\\x07" * (1 << 20))) as readable:
            if via == "http":
                server = await control.HttpServer.bind("127.0.0.1:0")
                pub = server.publish("req-xp", readable.metadata())
                where = server.local_addr
            else:
                channel = await control.NatsChannel.connect(where, timeout=5)
                pub = await channel.publish("req-xp", readable.metadata())
            print("READY", where, flush=True)
            with pub:
                await readable.wait_for_completion(timeout=30)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.parametrize("via", ["http", "nats"])
def test_prefill_decode_processes(via: str, request: pytest.FixtureRequest) -> None:
    where = request.getfixturevalue("nats").url if via == "nats" else "-"
    proc = subprocess.Popen(
        [sys.executable, "-c", PREFILL, via, where], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[0] == "READY", line
        where = line[1]

        async def main() -> None:
            decode = ferry.Connector(listen="127.0.0.1:0")
            if via == "http":
                md = await control.fetch_http(where, "req-xp", timeout=10)
            else:
                md = await (await control.NatsChannel.connect(where, timeout=5)).fetch("req-xp", timeout=10)
            assert await read_all(decode, md, 1 << 20) == b"\x07" * (1 << 20)

        asyncio.run(main())
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
