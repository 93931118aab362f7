"""Named remotes: other stores that threads are pushed to and pulled from.

A remote is a row of the `remotes` table: key = the remote's name (UTF-8), value =
sealed canonical JSON {"url": URL}. URLs are stored normalised: a plain path or a
`file://` URL becomes `file:///absolute/path` (relative paths resolve against the
directory current when the remote is added). Only `file://` stores exist today; a new
backend adds a scheme to `SCHEMES` and an `Endpoint` implementation (exchange/transfer.py).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agentcas.cas import encoding
from agentcas.cas.backends import check_refs_url, is_shared_url, parse_store_url
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import ConflictError, IntegrityError, NotFound, UsageError

SCHEMES = ("file", "s3")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


class BadRemote(UsageError):
    """A remote name or URL that is not acceptable."""


class UnknownRemote(NotFound):
    pass


@dataclass(frozen=True)
class Remote:
    name: str
    url: str
    refs: str | None = None  # a shared (s3://) remote's refs database

    @property
    def path(self) -> str:
        """The local path of a file:// remote."""
        return url_path(self.url)

    @property
    def shared(self) -> bool:
        return is_shared_url(self.url)

    def to_json(self) -> dict:
        """The JSON the CLI prints for it (the same as its stored document)."""
        return self.to_doc()

    def to_doc(self) -> dict:
        doc = {"name": self.name, "url": self.url}
        if self.refs:
            doc["refs"] = self.refs
        return doc


def check_remote_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadRemote(f"invalid remote name {name!r}: use 1..64 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    return name


def normalise_url(url: str, cwd: str | None = None) -> str:
    """`file:///absolute/path` for a plain path or a file:// URL; BadRemote otherwise."""
    if not url or "\0" in url:
        raise BadRemote(f"invalid remote URL {url!r}")
    match = _SCHEME.match(url)
    if match is None:
        path = url
    else:
        scheme = match.group(1).lower()
        if scheme == "s3":
            return normalise_s3_url(url)
        if scheme not in SCHEMES:
            raise BadRemote(f"unsupported remote URL scheme {scheme!r} in {url!r} "
                            f"(supported: a path or {', '.join(s + '://' for s in SCHEMES)})")
        parts = urllib.parse.urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise BadRemote(f"file:// URL names another host ({parts.netloc!r}): {url!r}")
        if parts.query or parts.fragment:
            raise BadRemote(f"file:// URL must not have a query or fragment: {url!r}")
        path = urllib.parse.unquote(parts.path)
        if not path.startswith("/"):
            raise BadRemote(f"file:// URL must hold an absolute path: {url!r}")
    path = os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(path)))
    return "file://" + urllib.parse.quote(path)


def normalise_s3_url(url: str) -> str:
    """`s3://BUCKET/PREFIX` as `--store` reads it (cas/backends.py parse_store_url: a remote
    is a store's URL), with no query or fragment."""
    parts = urllib.parse.urlsplit(url)
    try:
        address = parse_store_url(url)
    except UsageError:
        address = None
    if address is None or parts.query or parts.fragment:
        # A URL with user information is not repeated: its password would be printed.
        shown = "" if "@" in parts.netloc else f" {url!r}"
        raise BadRemote(f"invalid s3:// URL{shown}: use s3://BUCKET/PREFIX (credentials come from the "
                        "AWS environment, never from the URL)")
    return address.canonical


def check_refs_dsn(dsn: str | None, url: str) -> str | None:
    """A shared remote's refs database URL (cas/backends.py check_refs_url), without a
    password (libpq's PGPASSWORD or ~/.pgpass supply it), so no credential is ever written
    into the store."""
    if not is_shared_url(url):
        if dsn:
            raise BadRemote("--refs is only for an s3:// remote")
        return None
    if not dsn:
        raise BadRemote("an s3:// remote needs its refs database: --refs postgresql://USER@HOST:PORT/DB")
    try:
        check_refs_url(dsn)
    except UsageError as exc:
        raise BadRemote(str(exc)) from None
    parts = urllib.parse.urlsplit(dsn)
    if parts.password is not None or "password" in parts.query.lower():
        raise BadRemote("--refs must not hold a password (use PGPASSWORD or ~/.pgpass): it would be "
                        "stored in this store's remotes table")
    return dsn


@contextmanager
def store_made_for(remote: Remote) -> Iterator[bool]:
    """For a remote at a path that does not exist or is an empty directory: an empty store
    made there (like `git init --bare` before `git remote add`); yields whether one was made.
    If the block raises, the store made goes again (its directory too, unless it existed)."""
    if remote.shared or not absent_or_empty(remote.path):
        yield False
        return
    from agentcas.cas.store_format import init_embedded
    existed = os.path.isdir(remote.path)
    backends = init_embedded(remote.path)
    assert backends is not None  # the path held no store
    backends.close()
    try:
        yield True
    except BaseException:
        for name in os.listdir(remote.path):
            os.unlink(os.path.join(remote.path, name))
        if not existed:
            os.rmdir(remote.path)
        raise


def absent_or_empty(path: str) -> bool:
    """Whether `path` does not exist or is an empty directory (a store can be made there)."""
    return not os.path.lexists(path) or (os.path.isdir(path) and not os.path.islink(path)
                                         and not os.listdir(path))


def url_path(url: str) -> str:
    """The filesystem path of a normalised file:// URL."""
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path)


def _key(name: str) -> bytes:
    return name.encode("utf-8")


def _decode(key: bytes, value) -> Remote:
    doc = encoding.decode(unseal("remotes", key, value))
    if not isinstance(doc, dict) or not isinstance(doc.get("url"), str) \
            or not isinstance(doc.get("refs", ""), str):
        raise IntegrityError(f"remotes entry {key.decode('utf-8', 'replace')!r} is malformed")
    return Remote(key.decode("utf-8"), doc["url"], doc.get("refs"))


def add_remote(txn: MetaTxn, name: str, url: str, refs: str | None = None) -> Remote:
    """Record remote `name` -> `url` (already normalised); ConflictError if the name exists."""
    key = _key(check_remote_name(name))
    remote = Remote(name, url, refs)
    doc = {"url": url} if refs is None else {"refs": refs, "url": url}
    if not txn.put_new("remotes", key, seal("remotes", key, encoding.encode(doc))):
        raise ConflictError(f"remote {name!r} already exists (remove it first)")
    return remote


def read_remote(txn: MetaTxn, name: str) -> Remote:
    key = _key(check_remote_name(name))
    value = txn.get("remotes", key)
    if value is None:
        raise UnknownRemote(f"no remote named {name!r} (see 'agentcas remote list')")
    return _decode(key, value)


def list_remotes(txn: MetaTxn) -> list[Remote]:
    return [_decode(bytes(key), value) for key, value in txn.scan("remotes")]


def remove_remote(txn: MetaTxn, name: str) -> Remote:
    remote = read_remote(txn, name)
    txn.delete("remotes", _key(name))
    return remote
