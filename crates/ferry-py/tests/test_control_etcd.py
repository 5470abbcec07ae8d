"""ferry.control through etcd: a real etcd started on free ports with a data
directory of its own (skipped, with the reason, when it is not installed;
failed instead under FERRY_REQUIRE_ETCD=1, as CI sets it)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Any, Dict, Iterator, Optional

import pytest

import ferry
from ferry import control

SECRET = "0123456789abcdef0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Etcd:
    def __init__(self) -> None:
        self.port = free_port()
        peer = f"http://127.0.0.1:{free_port()}"
        self.dir = tempfile.mkdtemp(prefix="ferry-etcd-")
        self.proc = subprocess.Popen(
            [
                "etcd",
                "--name", "ferry-test",
                "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"ferry-test={peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "etcd did not become healthy"
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            reply: Dict[str, Any] = json.load(r)
            return reply

    def get(self, key: str) -> Optional[bytes]:
        """The value at ``key``, read straight from etcd."""
        reply = self.call("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = reply.get("kvs")
        if not kvs:
            return None
        return base64.b64decode(kvs[0].get("value", ""))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def etcd() -> Iterator[Etcd]:
    if shutil.which("etcd") is None:
        if os.environ.get("FERRY_REQUIRE_ETCD") == "1":
            pytest.fail("FERRY_REQUIRE_ETCD=1 but etcd is not installed (apt-get install etcd-server)")
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    e = Etcd()
    yield e
    e.stop()


async def read_all(c: ferry.Connector, md: ferry.RdmaMetadata, n: int) -> bytearray:
    dst = bytearray(n)
    async with c.begin_read(md, ferry.Descriptor(dst)) as read:
        await read.wait_for_completion()
    return dst


def test_etcd_round_trip_withdrawal_and_errors(etcd: Etcd) -> None:
    async def main() -> None:
        prefill = ferry.Connector(listen="127.0.0.1:0")
        decode = ferry.Connector(listen="127.0.0.1:0")
        a = await control.EtcdStore.connect(etcd.url, timeout=10)
        b = await control.EtcdStore.connect(etcd.url, timeout=10)
        assert a.etcd_key("req-1") == control.DEFAULT_ETCD_PREFIX + "/req-1"
        data = bytes(range(256)) * 64
        with await prefill.create_readable(ferry.Descriptor(data)) as readable:
            pub = await a.publish("req-1", readable.metadata())
            assert pub.key == "req-1" and pub.active
            assert etcd.get("/ferry/metadata/req-1") == readable.metadata().to_json().encode()
            with pytest.raises(control.AlreadyPublishedError):
                await b.publish("req-1", readable.metadata())
            md = await b.fetch("req-1", timeout=5)
            assert md.to_json() == readable.metadata().to_json()
            assert await read_all(decode, md, len(data)) == data
            await readable.wait_for_completion()
            await a.withdraw(pub)
            assert not pub.active and etcd.get("/ferry/metadata/req-1") is None
        t = time.monotonic()
        with pytest.raises(control.MetadataNotFoundError) as e:
            await b.fetch("req-1", timeout=0.3)
        assert isinstance(e.value, LookupError) and time.monotonic() - t < 2
        with pytest.raises(ValueError):
            await b.fetch("a/b", timeout=1)
        with pytest.raises(ValueError):
            await control.EtcdStore.connect(etcd.url, prefix="no-slash")
        with pytest.raises(control.NoServerError):
            await control.EtcdStore.connect(f"http://127.0.0.1:{free_port()}", timeout=0.3)

    asyncio.run(main())


def test_etcd_with_a_secret_holds_nothing_in_clear(etcd: Etcd) -> None:
    async def main() -> None:
        prefill = ferry.Connector(listen="127.0.0.1:0")
        sealed = await control.EtcdStore.connect(etcd.url, secret=SECRET, prefix="/ferry/t1")
        plain = await control.EtcdStore.connect(etcd.url, prefix="/ferry/t1")
        data = bytes(64)
        with await prefill.create_readable(ferry.Descriptor(data)) as readable:
            with await sealed.publish("req-s", readable.metadata()):
                stored = etcd.get("/ferry/t1/req-s")
                assert stored is not None and stored.startswith(b"FCE1")
                assert b'"token"' not in stored
                md = await sealed.fetch("req-s", timeout=5)
                assert md.to_json() == readable.metadata().to_json()
                with pytest.raises(control.ControlError):
                    await plain.fetch("req-s", timeout=0.3)

    asyncio.run(main())
