"""The S3 blob store (boto3): one immutable S3 object per agentcas object, and pack objects.

Layout: `s3://BUCKET/PREFIX` keeps object `ID` (raw 32 bytes) at `PREFIX/objects/<64 hex>`,
its framed value as the body; lexicographic key order is id order. That is the layout of a
store made before packs (format 2): a shared store now writes packs, `PREFIX/packs/<64
hex>`, through this store's pack methods (written once, read by ranges, listed, deleted);
s3_packs.py keeps their index and is the blob store a shared store uses. `PREFIX/agentcas-store.json`
is the store's marker, written once by `init` (create-if-absent): the id of the store whose
refs database owns the prefix (cas/backends.py checks the two belong together). Writes are
create-if-absent (`PUT` with `If-None-Match: *`; 412 means it was already there), so
the first write of a key wins and a key's bytes never change. A gateway that answers
501 to the condition (or `AGENTCAS_S3_CONDITIONAL_PUT=0`) gets HEAD-then-PUT instead:
racing writers then may both write, harmless because both write the same bytes.

A damaged leftover counts as absent: SeaweedFS (measured here) keeps an EMPTY object
when a PUT's connection closes after its headers and before any body byte (a writer
killed mid-upload), and If-None-Match then refuses every later write of that key. An
object shorter than a frame header can be no object, so it is absent to every read
(get, header, has_many, list: fsck and gc never see it) and a 412 on a key whose
stored object is that short is answered by writing the bytes over it
(unconditionally: they are the right bytes for that id).

Existence is batched: a few keys are HEADed in parallel; many keys are answered from
ListObjectsV2 over their key range, the sorted keys split into one segment per worker,
each segment paged with `StartAfter` jumping straight to its next unanswered key, so a
dense batch costs a page per 1,000 keys and a sparse one no more than a request per key.
get/put/delete of many keys run on a bounded thread pool over a connection pool of the
same size (botocore `max_pool_connections`); deletes go 250 keys per DeleteObjects.
A listing past one page runs as 16 ranges (the id's first hex digit), yielded in id order,
the reader's range and the next three listed in parallel, each a page ahead of the
reader, so the pages held do not grow with the store.

Endpoint, region and credentials come from the standard AWS environment
(AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...) through
boto3, and are never printed, logged or stored: errors name the endpoint and bucket
only (any credential text in a message is masked). Unreachable, timed-out or 5xx
requests are retried with exponential backoff for at most $AGENTCAS_RETRY_SECONDS
(20 s), then BlobUnavailable("S3 at ENDPOINT (bucket B) ...").
`requests` counts the HTTP requests sent, by operation (benchmarks, request budgets).
Crash points (cas/crashpoints.py): `s3.put` after each object written, `s3.pack` after
each pack written, `s3.delete` after each DeleteObjects request.
"""

from __future__ import annotations

import array
import collections
import os
import queue
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from agentcas.cas import chunking, crashpoints, framing, settings
from agentcas.cas.blobstore.base import KEY_SIZE, BlobInfo, BlobStore, BlobUnavailable
from agentcas.cas.retry import Retry
from agentcas.errors import UsageError

# Requests in parallel (threads and connections). 1 GiB first commit to localhost SeaweedFS
# on 2 cores, 1 Dec 2026: 16 connections 12.1 / 12.3 s, 8: 11.2 / 11.2 s, 4: 11.1 s (restic,
# whose default is 5, 12.0-12.6 s); more threads than cores only add GIL hand-offs here.
POOL_SIZE = 8  # $AGENTCAS_S3_CONNECTIONS overrides
HEAD_MAX = 32           # up to this many keys: parallel HEADs; more: listing
LIST_PAGE = 1000        # ListObjectsV2 maximum
DELETE_BATCH = 250      # keys per DeleteObjects (at most 1,000): a loaded SeaweedFS took >10 s for 1,000
# A listing's key ranges listed at once, and the pages each may wait ahead of its reader.
# Each page waiting (or being parsed) held ~0.3 MB of heap, far more than its 48 KB packed:
# 16 ranges x 8 pages ahead grew gc's peak anonymous memory ~290 B per stored object from
# 30,000 to 60,000 objects (the read-ahead filled with the store up to 128,000); 4 x 1:
# ~150 B, ~33 B with AGENTCAS_GC_MEMORY=1 MiB (gc's own spools small; 1 Dec 2026). A listing read as fast as it comes
# takes ~1.5x as long (60,000 objects: 2.6-3.3 s against 4.1-5.4 s, loaded machine).
LIST_RANGES = 4
LIST_AHEAD = 1
CONNECT_SECONDS = 3
READ_SECONDS = 10.0      # per request, $AGENTCAS_S3_READ_TIMEOUT
_RETRY_STATUS = {500, 502, 503, 504, 409}  # 409: a conditional write racing another
_RETRY_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling",
                "ThrottlingException", "RequestTimeTooSkewed", "OperationAborted", "ConditionalRequestConflict"}
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
MARKER = "agentcas-store.json"


def _parse_timestamp(text):
    """An S3 timestamp (ISO 8601 in listings, else RFC 1123) as an aware datetime, fast."""
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp
        return parse_timestamp(text)


def _no_expect(request, **_):
    if "Expect" in request.headers:
        del request.headers["Expect"]


def _whole_object(size: int | None) -> bool:
    """Whether a stored size can be an object (a shorter one is a damaged leftover, the module doc)."""
    return size is not None and size >= framing.HEADER_SIZE


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET/PREFIX` (the prefix without slashes at its ends), as
    cas/backends.py `parse_store_url` reads and checks it."""
    from agentcas.cas.backends import SHARED_SCHEME, parse_store_url
    if not url.startswith(SHARED_SCHEME):
        raise UsageError("an S3 blob store URL starts with s3://")
    address = parse_store_url(url)
    assert address.bucket is not None  # an s3:// address always names its bucket
    return address.bucket, address.prefix


def cap_malloc_arenas(arenas: int = 2) -> None:
    """For the process that owns its memory (the CLI): at most `arenas` glibc malloc arenas.

    glibc gives threads that allocate at once arenas of their own (up to 8 per core), and
    the request pool's boto3 garbage spreads over all of them: a gc on a shared store grew
    its peak RSS by ~500 B per stored object from 10,000 to 40,000 objects, ~250 B with two
    arenas (bench/bench_shared.py --only gc-full, 1 Dec 2026). glibc only; else nothing."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-8, arenas)  # M_ARENA_MAX


def endpoint_url() -> str | None:
    """$AWS_ENDPOINT_URL_S3, else $AWS_ENDPOINT_URL, else None (AWS itself), checked to be
    an http(s) URL with a host and a valid port: a malformed one is a usage error naming
    the variable (botocore would raise a bare ValueError, or fail at the first request)."""
    from urllib.parse import urlsplit
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        text = os.environ.get(name)
        if not text:
            continue
        parts = urlsplit(text.strip())
        try:
            port_ok = parts.port is None or 0 < parts.port < 65536
        except ValueError:
            port_ok = False
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            raise UsageError(f"${name} must be an http:// or https:// URL with a host and an optional port "
                             f"in 1..65535 (http://HOST:PORT), not {_without_userinfo(text)[:80]!r}")
        return text.strip()
    return None


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']*@")


def _without_userinfo(url: str) -> str:
    """`url` without a `user:password@` part (safe to print)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.rsplit("@", 1)[-1]
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rsplit('@', 1)[-1]}{slash}{path}"


class S3BlobStore(BlobStore):
    """Immutable framed objects in one bucket under one prefix, at `s3://BUCKET/PREFIX`."""

    chunk_sizes = chunking.REMOTE  # every object is a request (cas/chunking.py)

    def __init__(self, url: str, create: bool = False, bucket_with_marker: bool = False):
        import boto3
        import botocore.config
        import botocore.exceptions
        self._exceptions = botocore.exceptions
        self.bucket, self.prefix = parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._objects_prefix = f"{self.prefix}/objects/" if self.prefix else "objects/"
        self._packs_prefix = f"{self.prefix}/packs/" if self.prefix else "packs/"
        self._marker = f"{self.prefix}/{MARKER}" if self.prefix else MARKER
        self.endpoint = endpoint_url()
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        shown = _without_userinfo(self.endpoint) if self.endpoint else "the default AWS endpoint"
        self.name = f"S3 at {shown} (bucket {self.bucket})"
        self.conditional_put = os.environ.get("AGENTCAS_S3_CONDITIONAL_PUT", "1") != "0"
        self.requests: Counter = Counter()
        self._requests_lock = threading.Lock()
        self.connections = max(1, settings.whole_number("AGENTCAS_S3_CONNECTIONS", POOL_SIZE,
                                                        "a whole number of connections"))
        config = botocore.config.Config(
            max_pool_connections=self.connections, retries={"total_max_attempts": 1},
            connect_timeout=CONNECT_SECONDS,
            read_timeout=settings.number("AGENTCAS_S3_READ_TIMEOUT", READ_SECONDS),
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
            s3={"addressing_style": "path"} if self.endpoint else {})
        try:
            session = boto3.session.Session()
            # A listing page carries 1,000 timestamps: dateutil's parser took most of a has_many's CPU.
            session._session.get_component("response_parser_factory").set_parser_defaults(
                timestamp_parser=_parse_timestamp)
            self._client = session.client("s3", endpoint_url=self.endpoint, region_name=self.region, config=config)
        except self._exceptions.BotoCoreError as exc:
            raise BlobUnavailable(f"{self.name}: {self._reason(exc)}") from None
        self._client.meta.events.register("before-send.s3", self._count_request)
        # botocore asks before every PUT body (`Expect: 100-continue`): a round trip per object.
        self._client.meta.events.register("before-sign.s3.PutObject", _no_expect)
        self._pool = ThreadPoolExecutor(max_workers=self.connections, thread_name_prefix="agentcas-s3")
        self._open_bucket(create, bucket_with_marker)

    # -- requests, retries, errors ----------------------------------------------------------

    def _count_request(self, request=None, event_name: str = "", **_):
        with self._requests_lock:
            self.requests[event_name.rsplit(".", 1)[-1]] += 1

    def request_count(self) -> int:
        with self._requests_lock:
            return sum(self.requests.values())

    def _reason(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        text = _USERINFO.sub(r"\1", text)   # any URL's user:password@, before a key in it is masked
        for name in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"):
            secret = os.environ.get(name)
            if secret:
                text = text.replace(secret, "***")
        return text

    @staticmethod
    def _status(exc) -> tuple[int | None, str]:
        response = getattr(exc, "response", None) or {}
        return (response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                str(response.get("Error", {}).get("Code", "")))

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, self._exceptions.ClientError):
            status, code = self._status(exc)
            return status in _RETRY_STATUS or code in _RETRY_CODES
        return isinstance(exc, (self._exceptions.HTTPClientError, self._exceptions.ConnectionError,
                                self._exceptions.IncompleteReadError,
                                getattr(self._exceptions, "ResponseStreamingError", OSError), OSError))

    def _call(self, attempt):
        """attempt() retried with backoff while it fails for a retryable reason (cas/retry.py)."""
        try:
            return Retry().call(attempt, self._retryable, self._unavailable)
        except BlobUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - not retryable: botocore's own errors get one clear line
            if isinstance(exc, self._exceptions.NoCredentialsError):
                raise BlobUnavailable(f"{self.name}: no AWS credentials found (set AWS_ACCESS_KEY_ID and "
                                      "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)") from None
            if isinstance(exc, self._exceptions.BotoCoreError):   # botocore's own, not the server's
                raise BlobUnavailable(f"{self.name}: {self._reason(exc)}") from None
            raise

    def _unavailable(self, exc: BaseException, retry: Retry) -> BlobUnavailable:
        return BlobUnavailable(f"{self.name} unavailable {retry.summary()}: {self._reason(exc)}")

    def _refused(self, exc: BaseException, what: str) -> BlobUnavailable:
        status, code = self._status(exc)
        return BlobUnavailable(f"{self.name} refused {what}: {code or status} ({self._reason(exc)})")

    def _missing(self, exc: BaseException) -> bool:
        if not isinstance(exc, self._exceptions.ClientError):
            return False
        status, code = self._status(exc)
        if code == "NoSuchBucket":
            raise BlobUnavailable(f"{self.name}: the bucket does not exist") from None
        return status == 404 or code in _MISSING_CODES

    # -- bucket --------------------------------------------------------------------------

    def _open_bucket(self, create: bool, with_marker: bool) -> None:
        """Check the bucket is there, or (`create`) make it. `with_marker` (init): a missing
        one is made only when the store's marker is written (`create_marker`): init first asks
        the refs database whether this prefix may be claimed, and a refusal there (a mistyped
        bucket beside another store's refs) must leave no bucket behind."""
        self._bucket_to_create = False
        try:
            self._call(lambda: self._client.head_bucket(Bucket=self.bucket))
            return
        except self._exceptions.ClientError as exc:
            status, code = self._status(exc)
            if status != 404 and code not in ("NoSuchBucket", "404", "NotFound"):
                raise self._refused(exc, f"access to bucket {self.bucket}") from None
        if not create:
            raise BlobUnavailable(f"{self.name}: the bucket does not exist (run `agentcas init` with this URL)")
        if with_marker:
            self._bucket_to_create = True
        else:
            self._create_bucket()

    def _create_bucket(self) -> None:
        options = {}
        if self.region != "us-east-1":
            options["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self._call(lambda: self._client.create_bucket(Bucket=self.bucket, **options))
        except self._exceptions.ClientError as exc:
            if self._status(exc)[1] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._refused(exc, f"to create bucket {self.bucket}") from None

    # -- the store's marker --------------------------------------------------------------

    def read_marker(self) -> bytes | None:
        """The marker's bytes, or None if the prefix has none (no store was made here)."""
        return None if self._bucket_to_create else self._read(self._marker)

    def create_marker(self, data: bytes) -> bool:
        """Write the marker unless one exists (If-None-Match: *); True if written now. The
        bucket `init` found missing is made here, first."""
        if self._bucket_to_create:
            self._create_bucket()
            self._bucket_to_create = False
        return self._create(self._marker, data)

    # -- reads and create-if-absent writes of one name ---------------------------------

    def _fetch(self, request, doing: str, absent=None):
        """`request()` with the retries of `_call`; None where it finds nothing there
        (`absent(exc)`, default: no such key); a refusal is one line saying what it was `doing`."""
        absent = absent or self._missing

        def attempt():
            try:
                return request()
            except self._exceptions.ClientError as exc:
                if absent(exc):
                    return None
                raise
        try:
            return self._call(attempt)
        except self._exceptions.ClientError as exc:
            raise self._refused(exc, doing) from None

    def _read(self, name: str) -> bytes | None:
        """The bytes stored under `name`, or None if there are none."""
        return self._fetch(lambda: self._client.get_object(Bucket=self.bucket, Key=name)["Body"].read(),
                           f"to read {name}")

    def _create(self, name: str, body: bytes, stored=None, point: str | None = None) -> bool:
        """Write `body` under `name` unless something is stored there; True if written now.

        With If-None-Match: * where the gateway does it (falling back, for good, to a check
        before the write where it answers 501). `stored(size)` judges what is there (default:
        anything is): a name whose bytes are judged not stored is written over.
        """
        stored = stored or (lambda size: size is not None)
        if not self.conditional_put and stored(self._stored_size(name)):
            return False

        def write(options):
            self._client.put_object(Bucket=self.bucket, Key=name, Body=body, **options)
            if point:
                crashpoints.reached(point)
            return True

        def attempt():
            options = {"IfNoneMatch": "*"} if self.conditional_put else {}
            try:
                return write(options)
            except self._exceptions.ClientError as exc:
                status, code = self._status(exc)
                if status == 412 or code == "PreconditionFailed":
                    return not stored(self._stored_size(name)) and write({})
                raise
        try:
            return self._call(attempt)
        except self._exceptions.ClientError as exc:
            status, code = self._status(exc)
            if self.conditional_put and (status == 501 or code == "NotImplemented"):
                self.conditional_put = False  # the gateway does not do If-None-Match
                return self._create(name, body, stored, point)
            raise self._refused(exc, f"to write {name}") from None

    # -- keys ----------------------------------------------------------------------------

    def _name(self, key: bytes) -> str:
        key = bytes(key)
        if len(key) != KEY_SIZE:
            raise ValueError(f"a blob key is {KEY_SIZE} bytes, not {len(key)}")
        return self._objects_prefix + key.hex()

    def _key(self, name: str) -> bytes | None:
        """The raw key of a listed name, or None for anything that is not an object."""
        hexid = name[len(self._objects_prefix):]
        if len(hexid) != 2 * KEY_SIZE or not name.startswith(self._objects_prefix):
            return None
        try:
            return bytes.fromhex(hexid)
        except ValueError:
            return None

    # -- BlobStore -----------------------------------------------------------------------

    def get(self, key):
        body = self._read(self._name(key))
        return body if body is not None and len(body) >= framing.HEADER_SIZE else None  # a damaged leftover

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        if len(keys) <= 1:
            return super().get_many(keys)
        return {k: v for k, v in zip(keys, self._pool.map(self.get, keys)) if v is not None}

    def header(self, key):
        name = self._name(key)

        def request():
            response = self._client.get_object(Bucket=self.bucket, Key=name,
                                               Range=f"bytes=0-{framing.HEADER_SIZE - 1}")
            head = response["Body"].read()[:framing.HEADER_SIZE]
            return head if len(head) == framing.HEADER_SIZE else None  # a damaged leftover
        return self._fetch(request, f"to read {name}",  # 416: an empty leftover
                           absent=lambda exc: self._missing(exc) or self._status(exc)[0] == 416)

    def headers(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """Ranged reads of many headers, in parallel on the pool (gc reads one per candidate)."""
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        if len(keys) <= 1:
            return super().headers(keys)
        return {k: h for k, h in zip(keys, self._pool.map(self.header, keys)) if h is not None}

    def _head(self, key: bytes) -> bool:
        """Whether the object is stored whole enough to be an object (the module doc: damaged leftovers)."""
        return _whole_object(self._stored_size(self._name(key)))

    def _stored_size(self, name: str) -> int | None:
        return self._fetch(lambda: int(self._client.head_object(Bucket=self.bucket, Key=name)["ContentLength"]),
                           f"to check {name}")

    def has_many(self, keys: Iterable[bytes]) -> set[bytes]:
        keys = sorted(set(bytes(k) for k in keys))
        if not keys:
            return set()
        if len(keys) <= HEAD_MAX:
            return {k for k, present in zip(keys, self._pool.map(self._head, keys)) if present}
        per = max(HEAD_MAX, -(-len(keys) // self.connections))
        segments = [keys[i:i + per] for i in range(0, len(keys), per)]
        present: set[bytes] = set()
        for found in self._pool.map(self._listed, segments):
            present |= found
        return present

    def _listed(self, keys: list[bytes]) -> set[bytes]:
        """Which of the sorted `keys` exist, from listing pages that start at each unanswered key."""
        present: set[bytes] = set()
        i = 0
        last_name = ""
        while i < len(keys):
            # A strict prefix of the key's name sorts just before it: StartAfter it lists the key.
            start_after = max(self._name(keys[i])[:-1], last_name)

            def attempt(start_after=start_after):
                return self._client.list_objects_v2(Bucket=self.bucket, Prefix=self._objects_prefix,
                                                    StartAfter=start_after, MaxKeys=LIST_PAGE)
            try:
                page = self._call(attempt)
            except self._exceptions.ClientError as exc:
                raise self._refused(exc, f"to list {self._objects_prefix}") from None
            names = [item["Key"] for item in page.get("Contents", [])]
            listed = {self._key(item["Key"]) for item in page.get("Contents", [])
                      if int(item["Size"]) >= framing.HEADER_SIZE}  # a shorter one is damaged: absent
            if not names:
                return present
            last_name = names[-1]
            last = self._key(last_name) or b"\xff" * KEY_SIZE
            while i < len(keys) and keys[i] <= last:
                if keys[i] in listed:
                    present.add(keys[i])
                i += 1
            if not page.get("IsTruncated"):
                return present
        return present

    def _put(self, key: bytes, value: bytes) -> bool:
        # What is stored under an object's name counts only if it is whole enough to be an
        # object: a damaged leftover (the module doc) is written over by these bytes, right for this id.
        return self._create(self._name(key), value, stored=_whole_object, point="s3.put")

    def put_many(self, items: Mapping[bytes, bytes]) -> tuple[int, int]:
        written = self.put_many_written(items)
        return len(written), sum(len(items[k]) for k in written)

    def put_many_written(self, items: Mapping[bytes, bytes]) -> set[bytes]:
        """put_many, answering which keys were written now (the cache keeps exactly those)."""
        pairs = [(bytes(k), v) for k, v in items.items()]
        if len(pairs) == 1:
            written = [self._put(*pairs[0])]
        else:
            written = list(self._pool.map(lambda pair: self._put(*pair), pairs))
        return {k for (k, _), new in zip(pairs, written) if new}

    def _delete_batch(self, keys: list[bytes]) -> None:
        self._delete_names([self._name(k) for k in keys])

    def _delete_names(self, names: list[str]) -> None:
        request = {"Objects": [{"Key": name} for name in names], "Quiet": True}

        def attempt():
            errors = self._client.delete_objects(Bucket=self.bucket, Delete=request).get("Errors", [])
            crashpoints.reached("s3.delete")
            failed = [e for e in errors if e.get("Code") not in ("NoSuchKey",)]
            if failed:
                raise self._exceptions.ClientError(
                    {"Error": {"Code": failed[0].get("Code", "InternalError"), "Message": failed[0].get("Message", "")},
                     "ResponseMetadata": {"HTTPStatusCode": 500}}, "DeleteObjects")
        try:
            self._call(attempt)
        except self._exceptions.ClientError as exc:
            raise self._refused(exc, f"to delete objects under {self.url}") from None

    def delete_many(self, keys: Iterable[bytes]) -> int:
        # DeleteObjects reports absent keys as deleted too: count what existed first.
        present = sorted(self.has_many(keys))
        batches = [present[i:i + DELETE_BATCH] for i in range(0, len(present), DELETE_BATCH)]
        list(self._pool.map(self._delete_batch, batches))
        return len(present)

    def _list_page(self, prefix: str, token: str | None = None, start_after: str | None = None) -> dict:
        options = {"ContinuationToken": token} if token else ({"StartAfter": start_after} if start_after else {})
        try:
            return self._call(lambda: self._client.list_objects_v2(Bucket=self.bucket, Prefix=prefix,
                                                                   MaxKeys=LIST_PAGE, **options))
        except self._exceptions.ClientError as exc:
            raise self._refused(exc, f"to list {prefix}") from None

    def _infos(self, page: dict) -> tuple[bytes, array.array, array.array]:
        """A listing page packed as (keys, stored sizes, written_at): ~48 bytes an object while
        it waits in a read-ahead queue, where BlobInfo objects would cost ~400."""
        keys, sizes, times = bytearray(), array.array("Q"), array.array("d")
        for item in page.get("Contents", []):
            key = self._key(item["Key"])
            if key is not None and int(item["Size"]) >= framing.HEADER_SIZE:  # else a damaged leftover
                keys += key
                sizes.append(int(item["Size"]))
                times.append(item["LastModified"].timestamp())
        return bytes(keys), sizes, times

    @staticmethod
    def _unpacked(packed: tuple) -> Iterator[BlobInfo]:
        keys, sizes, times = packed
        for index, size in enumerate(sizes):
            yield BlobInfo(keys[index * KEY_SIZE:(index + 1) * KEY_SIZE], size, times[index], None)

    def list(self) -> Iterator[BlobInfo]:
        """Every object in id order. One page answers a small store; a larger one is listed
        as 16 ranges (by the id's first hex digit), yielded in order: the reader's range and
        the next LIST_RANGES - 1 are listed at once, each buffering at most LIST_AHEAD
        pages ahead of the reader, packed (~48 bytes an object); a range's lister starts
        when the one LIST_RANGES before it is finished. So at most LIST_RANGES x
        (LIST_AHEAD + 1) pages are parsed or waiting at any time, whatever the store's size."""
        first = self._list_page(self._objects_prefix)
        yield from self._unpacked(self._infos(first))
        if not first.get("IsTruncated"):
            return
        last = first["Contents"][-1]["Key"]
        reached = last[len(self._objects_prefix):][:1]  # the first page covered ids up to `last`
        ranges = collections.deque((self._objects_prefix + digit, last if digit == reached else None)
                                   for digit in "0123456789abcdef" if digit >= reached)
        stop = threading.Event()
        listing: collections.deque = collections.deque()  # the queues of the ranges being listed, in order

        def start_next() -> None:
            prefix, start_after = ranges.popleft()
            pages: queue.Queue = queue.Queue(maxsize=LIST_AHEAD)
            listing.append(pages)
            threading.Thread(target=self._list_range, daemon=True, name="agentcas-s3-list",
                             args=(prefix, start_after, pages, stop)).start()
        try:
            while ranges and len(listing) < LIST_RANGES:
                start_next()
            while listing:
                pages = listing[0]
                while True:
                    item = pages.get()
                    if item is None:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    yield from self._unpacked(item)
                listing.popleft()
                if ranges:
                    start_next()
        finally:
            stop.set()
            for pages in listing:  # unblock producers waiting on a full queue
                while not pages.empty():
                    pages.get_nowait()

    def _list_range(self, prefix: str, start_after: str | None, pages: queue.Queue, stop) -> None:
        """Producer: the pages of one key range onto `pages`, then None (or the error)."""
        token = None

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    pages.put(item, timeout=0.2)
                    return True
                except queue.Full:
                    continue
            return False
        try:
            while not stop.is_set():
                page = self._list_page(prefix, token, start_after)
                if not put(self._infos(page)):
                    return
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    break
            put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            put(exc)

    # -- pack objects (s3_packs.py): written once under PREFIX/packs/<64 hex> ------------

    def put_pack(self, name: str, body: bytes) -> bool:
        """Write pack `name` (its 64-hex hash) unless stored whole; True if written now. A
        shorter object under its name is a damaged leftover (a killed upload), written over."""
        return self._create(self._packs_prefix + name, body, stored=lambda size: size == len(body),
                            point="s3.pack")

    def read_pack_range(self, name: str, start: int, length: int) -> bytes | None:
        """Bytes [start, start + length) of pack `name` (fewer if it is cut short), or None
        if the pack is missing or ends before `start`."""
        key = self._packs_prefix + name

        def request():
            response = self._client.get_object(Bucket=self.bucket, Key=key,
                                               Range=f"bytes={start}-{start + length - 1}")
            return response["Body"].read()
        return self._fetch(request, f"to read {key}",
                           absent=lambda exc: self._missing(exc) or self._status(exc)[0] == 416)

    def pack_size(self, name: str) -> int | None:
        """The stored size of pack `name`, or None if there is none."""
        return self._stored_size(self._packs_prefix + name)

    def read_pack_ranges(self, requests: Sequence[tuple[str, int, int]]) -> Sequence[bytes | None]:
        """read_pack_range for each (name, start, length), in parallel on the pool."""
        if len(requests) <= 1:
            return [self.read_pack_range(*request) for request in requests]
        return list(self._pool.map(lambda request: self.read_pack_range(*request), requests))

    def put_packs(self, packs: Sequence[tuple[str, bytes]]) -> None:
        """put_pack for each (name, body), in parallel on the pool."""
        if len(packs) <= 1:
            for name, body in packs:
                self.put_pack(name, body)
            return
        list(self._pool.map(lambda pack: self.put_pack(*pack), packs))

    def list_packs(self) -> Iterator[tuple[str, int, float]]:
        """(name, stored size, written_at) of every pack object, in name order."""
        token = None
        while True:
            page = self._list_page(self._packs_prefix, token)
            for item in page.get("Contents", []):
                name = item["Key"][len(self._packs_prefix):]
                if len(name) == 2 * KEY_SIZE:
                    yield name, int(item["Size"]), item["LastModified"].timestamp()
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete_packs(self, names: Sequence[str]) -> None:
        """Delete the named pack objects (absent ones are ignored)."""
        for start in range(0, len(names), DELETE_BATCH):
            self._delete_names([self._packs_prefix + name for name in names[start:start + DELETE_BATCH]])

    def used_bytes(self) -> int:
        """The stored bytes, from a full listing (one request per 1,000 objects)."""
        return sum(info.size for info in self.list())

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
