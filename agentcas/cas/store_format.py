"""The store's format record (`meta/format`, docs/FORMAT.md section 7) and its upgrade.

Written once when a store is made: `{"format": STORE_FORMAT, "created_at": ...}`. A
reader refuses a store whose format is newer than it reads (StoreFormatError, exit 4);
a writable open of an older store marks it current (`upgraded_from`, `upgraded_at`):
format 2 added packed objects and compact reflog rows, which every reader here reads in
both forms, so nothing else is converted, but an older agentcas must stop at the record
instead of misreading the new writes.
"""

from __future__ import annotations

import datetime

from agentcas.cas import encoding
from agentcas.cas.backends import STORE_KEY, Stores, check_binding
from agentcas.cas.leases import sweep_active
from agentcas.cas.lmdb_store import StoreUnavailable
from agentcas.cas.metastore.base import MetaTxn as Txn
from agentcas.cas.metastore.base import Read
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import IntegrityError

FORMAT_KEY = b"format"
STORE_FORMAT = 2


class StoreFormatError(IntegrityError):
    """The store's format is newer than this agentcas reads."""


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_format(stores: Stores, binding: bytes | None = None) -> bool:
    """Write the store's format record (and gc's idle fence row; a shared store's binding
    row, cas/backends.py) unless present; True if this made the store."""
    doc = encoding.encode({"format": STORE_FORMAT, "created_at": utc_now()})

    def create(txn: Txn) -> bool:
        sweep_active(txn, 0.0, lock=True)  # writes the fence row leases lock (cas/leases.py)
        if binding is not None:
            txn.put_new("meta", STORE_KEY, binding)
        return txn.put_new("meta", FORMAT_KEY, seal("meta", FORMAT_KEY, doc))

    return stores.meta.write(create)


def check_format(stores: Stores, where: str, readonly: bool) -> None:
    """Refuse a store without a format record or with a newer one; upgrade an older one
    unless `readonly`. One request reads the record and a shared store's binding."""
    _, (value, binding) = stores.meta.exchange(reads=[Read("meta", FORMAT_KEY), Read("meta", STORE_KEY)])
    if stores.shared:
        check_binding(stores, binding)
    if value is None:
        raise StoreUnavailable(f"not an agentcas store (no format record): {where}")
    doc = encoding.decode(unseal("meta", FORMAT_KEY, value))
    if doc.get("format", 0) > STORE_FORMAT:
        raise StoreFormatError(
            f"store format {doc['format']} is newer than this agentcas reads ({STORE_FORMAT}); "
            "upgrade agentcas")
    if doc.get("format", 0) < STORE_FORMAT and not readonly:
        _upgrade_format(stores, doc)


def _upgrade_format(stores: Stores, doc: dict) -> None:
    """Mark an older store as the current format (nothing else is converted)."""
    upgraded = encoding.encode(dict(doc, format=STORE_FORMAT, upgraded_from=doc.get("format", 0),
                                    upgraded_at=utc_now()))

    def mark(txn: Txn):
        current = encoding.decode(unseal("meta", FORMAT_KEY, txn.get("meta", FORMAT_KEY)))
        if current.get("format", 0) < STORE_FORMAT:
            txn.put("meta", FORMAT_KEY, seal("meta", FORMAT_KEY, upgraded))

    stores.meta.write(mark)
