"""The S3 blob store on a real SeaweedFS: URLs, buckets, batching, credentials and faults.

Fault tests run their own gateway (stopping it disturbs no other test) with a short
retry bound ($AGENTCAS_RETRY_SECONDS), and check the one-line error that names the service.
"""

from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from agentcas.cas import framing
from agentcas.cas.blobstore import s3
from agentcas.cas.blobstore.base import BlobUnavailable
from agentcas.cas.blobstore.s3 import HEAD_MAX, S3BlobStore, parse_url
from agentcas.errors import UsageError

from support.services import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, SeaweedServer


def key(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(28)


def value(data: bytes) -> bytes:
    return framing.frame(framing.KIND_CHUNK, data, written_at=1_780_000_000)


@pytest.fixture
def own_gateway(monkeypatch):
    """A SeaweedFS of this test's own, the store's environment pointing at it."""
    server = SeaweedServer()
    for name, val in server.env().items():
        monkeypatch.setenv(name, val)
    monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "3")
    yield server
    server.close()


def test_parse_url():
    assert parse_url("s3://bucket/a/b/") == ("bucket", "a/b")
    assert parse_url("s3://bucket") == ("bucket", "")
    with pytest.raises(UsageError):  # exit 2 in the CLI, one line
        parse_url("s3:///prefix")
    with pytest.raises(UsageError):
        parse_url("http://bucket/prefix")


def test_keys_live_under_the_prefix_as_hex_ids(s3_server, s3_url):
    store = S3BlobStore(s3_url)
    store.put_if_absent(key(7), value(b"seven"))
    bucket, prefix = parse_url(s3_url)
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
    assert [item["Key"] for item in listed] == [f"{prefix}/objects/{key(7).hex()}"]
    with pytest.raises(ValueError):
        store.get(b"short")


def test_a_missing_bucket_is_refused_unless_created(s3_server):
    bucket = "agentcas-" + uuid.uuid4().hex[:10]
    with pytest.raises(BlobUnavailable, match=f"bucket {bucket}.*does not exist.*agentcas init"):
        S3BlobStore(f"s3://{bucket}/p")
    store = S3BlobStore(f"s3://{bucket}/p", create=True)
    assert store.put_if_absent(key(1), value(b"x"))
    assert S3BlobStore(f"s3://{bucket}/p").get(key(1)) == value(b"x")
    S3BlobStore(f"s3://{bucket}/p", create=True)  # again: the bucket is there


def test_wrong_credentials_name_the_service_never_the_secret(s3_server, s3_url, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-" + S3_SECRET_KEY)
    monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "120")  # a retrying client would take this long
    started = time.monotonic()
    with pytest.raises(BlobUnavailable) as raised:
        S3BlobStore(s3_url)
    message = str(raised.value)
    assert message.startswith(f"S3 at {s3_server.endpoint} (bucket ")
    assert "refused" in message and "\n" not in message
    assert S3_SECRET_KEY not in message and S3_ACCESS_KEY not in message
    assert time.monotonic() - started < 60  # a refusal is final: no retries (they would take 120 s)


def test_existence_checks_are_batched(s3_url):
    store = S3BlobStore(s3_url)
    stored = [key(i) for i in range(0, 400)]
    store.put_many({k: value(k) for k in stored})
    store.requests.clear()
    asked = stored + [key(i) for i in range(1000, 1100)]
    assert store.has_many(asked) == set(stored)
    assert store.requests["HeadObject"] == 0
    assert 1 <= store.requests["ListObjectsV2"] <= 16  # one segment per worker at most
    store.requests.clear()
    assert store.has_many(stored[:HEAD_MAX]) == set(stored[:HEAD_MAX])
    assert store.requests == {"HeadObject": HEAD_MAX}


def test_header_is_one_ranged_read(s3_url):
    store = S3BlobStore(s3_url)
    big = value(os.urandom(1 << 20))
    store.put_if_absent(key(1), big)
    store.requests.clear()
    assert store.header(key(1)) == big[:framing.HEADER_SIZE]
    assert store.requests == {"GetObject": 1}


def test_a_stopped_gateway_is_retried_then_named(own_gateway):
    store = S3BlobStore(own_gateway.url(), create=True)
    store.put_if_absent(key(1), value(b"one"))
    own_gateway.stop()
    for operation in (lambda: store.get(key(1)), lambda: store.put_if_absent(key(2), value(b"two")),
                      lambda: list(store.list())):
        started = time.monotonic()
        with pytest.raises(BlobUnavailable) as raised:
            operation()
        elapsed = time.monotonic() - started
        message = str(raised.value)
        assert message.startswith(f"S3 at {own_gateway.endpoint} (bucket agentcas-test) unavailable after ")
        assert "\n" not in message and S3_SECRET_KEY not in message
        assert 2.5 <= elapsed < 40  # retried for the bound (3 s), then gave up (slack for a loaded machine)
    own_gateway.start()
    assert store.get(key(1)) == value(b"one")  # the same store works again
    assert store.put_if_absent(key(2), value(b"two"))


def test_a_gateway_restarted_during_the_retries_is_not_an_error(own_gateway, monkeypatch):
    monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "20")
    store = S3BlobStore(own_gateway.url(), create=True)
    store.put_if_absent(key(1), value(b"one"))
    own_gateway.stop()
    threading.Timer(1.0, own_gateway.start).start()
    assert store.get(key(1)) == value(b"one")
    more = {key(2): value(b"two"), key(3): value(b"three")}
    store.put_many(more)  # (a write whose answer was lost is retried and then counts as present)
    assert store.get_many(list(more)) == more


def test_a_hung_gateway_times_out_then_is_named(own_gateway, monkeypatch):
    store = S3BlobStore(own_gateway.url(), create=True)
    store.put_if_absent(key(1), value(b"one"))
    # Only the store that meets the hung gateway has the 1 s read timeout: on a loaded
    # machine a healthy gateway can take that long too, and the set-up must not fail on it.
    monkeypatch.setenv("AGENTCAS_S3_READ_TIMEOUT", "1")
    hung = S3BlobStore(own_gateway.url())
    own_gateway.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BlobUnavailable, match="unavailable after"):
            hung.get(key(1))
        assert time.monotonic() - started < 40  # bounded (slack for a loaded machine)
    finally:
        own_gateway.resume()
        hung.close()
    assert store.get(key(1)) == value(b"one")


class _FlakyProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the gateway byte for byte (the signature covers Host, kept as sent),
    but answers 503 to the first `failures` requests."""

    protocol_version = "HTTP/1.1"
    failures = 0
    upstream: tuple = ()
    served: list = []

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        cls.served.append(self.command)
        if cls.failures > 0:
            cls.failures -= 1
            payload = b"<Error><Code>ServiceUnavailable</Code><Message>try again</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*cls.upstream, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")}
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        self.send_response(response.status)
        for name, val in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, val)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        conn.close()

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

    def log_message(self, *args):
        pass


def test_5xx_answers_are_retried(s3_server, s3_url, monkeypatch):
    _FlakyProxy.upstream = ("127.0.0.1", s3_server.ports["s3"])
    _FlakyProxy.served = []
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.server_address[1]}")
        store = S3BlobStore(s3_url)
        _FlakyProxy.failures = 3
        assert store.put_if_absent(key(1), value(b"one"))
        assert _FlakyProxy.served[-4:] == ["PUT"] * 4  # three 503s, then the write
        _FlakyProxy.failures = 2
        assert store.get(key(1)) == value(b"one")
        monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "1")
        _FlakyProxy.failures = 10 ** 6
        with pytest.raises(BlobUnavailable, match=r"unavailable after \d+ tr(?:y|ies).*ServiceUnavailable|503"):
            store.get(key(1))
    finally:
        proxy.shutdown()


def test_a_long_listing_is_complete_in_order_and_may_stop_early(s3_url):
    store = S3BlobStore(s3_url)
    keys = sorted(os.urandom(32) for _ in range(2300))  # every first hex digit: the ranges in parallel
    store.put_many({k: value(k) for k in keys})
    store.requests.clear()
    infos = list(store.list())
    assert [info.key for info in infos] == keys and all(info.size == len(value(k)) for info, k in zip(infos, keys))
    assert store.requests["ListObjectsV2"] > 2  # one page, then the remaining ranges
    listing = store.list()
    assert [next(listing).key for _ in range(1500)] == keys[:1500]
    listing.close()  # the readers ahead stop; nothing hangs
    assert sum(1 for _ in store.list()) == len(keys)


def test_a_listing_read_slowly_holds_a_few_pages_however_long_the_store(s3_url, monkeypatch):
    """The readers ahead stop after LIST_RANGES x (LIST_AHEAD + 1) pages: each page waiting
    pins heap, and 16 ranges x 8 pages ahead grew gc's memory with the store up to 128,000
    objects. Pages of 5 objects here, so 16 ranges hold ~10 pages each."""
    monkeypatch.setattr(s3, "LIST_PAGE", 5)
    store = S3BlobStore(s3_url)
    keys = sorted(os.urandom(32) for _ in range(800))
    store.put_many({k: value(k) for k in keys})
    store.requests.clear()
    listing = store.list()
    assert [next(listing).key for _ in range(6)] == keys[:6]  # the first page, then range 0's first
    made, since = -1, time.monotonic()  # wait until the readers ahead stop asking (or 10 s)
    while time.monotonic() - since < 10:
        time.sleep(0.3)
        now = store.requests["ListObjectsV2"]
        if now == made:
            break
        made = now
    # the first page, then LIST_AHEAD waiting + 1 held by each range's lister, plus the page
    # the reader took from its range's queue
    assert store.requests["ListObjectsV2"] <= 1 + s3.LIST_RANGES * (s3.LIST_AHEAD + 1) + 1
    assert [info.key for info in listing] == keys[6:]  # and the rest comes, in order
    assert store.requests["ListObjectsV2"] >= 800 // 5


def cut_off_put(s3_server, name: str, body: bytes) -> None:
    """A PUT whose connection closes after its headers, before any body byte (a writer
    killed mid-upload), signed as botocore signs it."""
    import socket

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    url = f"{s3_server.endpoint}/{S3_BUCKET}/{name}"
    request = AWSRequest(method="PUT", url=url, data=body,
                         headers={"Content-Length": str(len(body)), "If-None-Match": "*"})
    S3SigV4Auth(Credentials(S3_ACCESS_KEY, S3_SECRET_KEY), "s3", "us-east-1").add_auth(request)
    host, port = s3_server.endpoint.split("//")[1].split(":")
    head = f"PUT /{S3_BUCKET}/{name} HTTP/1.1\r\nHost: {host}:{port}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items()) + "\r\n"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode())
        time.sleep(0.2)


def test_an_empty_leftover_of_a_cut_off_put_is_absent_and_written_over(s3_server, s3_url):
    """SeaweedFS keeps an empty object for a PUT cut off before its body; If-None-Match then
    refuses every later write. The store calls such a leftover absent and writes over it."""
    store = S3BlobStore(s3_url)
    bucket, prefix = parse_url(s3_url)
    names = [f"{prefix}/objects/{key(i).hex()}" for i in range(40)]
    for name in names[:1] + names[10:]:
        cut_off_put(s3_server, name, value(b"x" * 1000))
    client = s3_server.client()
    for _ in range(50):  # the gateway finishes the aborted request on its own time
        if len(client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])) == 31:
            break
        time.sleep(0.1)
    assert client.get_object(Bucket=S3_BUCKET, Key=names[0])["Body"].read() == b""  # the server's behaviour
    assert store.has_many([key(0)]) == set()                        # HEAD path
    assert store.has_many([key(i) for i in range(40)]) == set()     # listing path
    assert store.get(key(0)) is None and store.header(key(0)) is None and list(store.list()) == []
    items = {key(i): value(b"%d" % i) for i in range(40)}
    assert store.put_many_written(items) == set(items)
    assert store.get_many(list(items)) == items
    assert store.has_many(list(items)) == set(items)
    assert store.put_many_written(items) == set()  # whole objects are never written over


ARENAS = r"""
import ctypes, os, sys, tempfile, threading
from agentcas.cas.blobstore.s3 import cap_malloc_arenas
if sys.argv[1] == "capped":
    cap_malloc_arenas()
def churn():
    for _ in range(200):
        junk = [bytearray(4000) for _ in range(100)]
barrier = threading.Barrier(16)
def worker():
    barrier.wait()
    churn()
threads = [threading.Thread(target=worker) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
path = tempfile.mktemp()
handle = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, handle)
libc.fclose(handle)
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_cap_malloc_arenas_bounds_the_arenas_of_a_thread_pool():
    counts = {how: int(subprocess.run([sys.executable, "-c", ARENAS, how], capture_output=True, text=True,
                                      check=True).stdout) for how in ("capped", "default")}
    assert counts["capped"] <= 2 < counts["default"], counts
