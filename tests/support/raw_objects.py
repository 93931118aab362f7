"""Tests' raw access to an embedded store's objects where they are kept (packs, cas/packs.py):
list them, damage one, drop one, or plant one, below every check agentcas makes on a write."""

from __future__ import annotations

from contextlib import contextmanager

from agentcas.cas import framing, packs
from agentcas.cas.lmdb_store import open_lmdb


def keys(txn) -> set[bytes]:
    """Every stored object id (a TableTxn of the store's environment)."""
    return {info.key for info in packs.list_objects(txn)}


def values(txn) -> dict[bytes, bytes]:
    """{id: stored value (section 3.1)} of every object."""
    return {info.key: packs.get(txn, info.key) for info in packs.list_objects(txn)}


def stored_bytes(txn) -> int:
    """Bytes of every object's record (what gc reports deleting)."""
    return sum(info.size for info in packs.list_objects(txn))


def plant(txn, raw: bytes, value) -> None:
    """Store `value` under `raw` as it is (replacing any stored one), in a pack of its own; its
    header is copied field by field without being checked, so a damaged one stays damaged."""
    kind, codec, size, written_at, _ = framing.HEADER.unpack_from(bytes(value))
    record = packs.encode_record(raw, kind & 0x0F, codec & 0x0F, size, written_at, bytes(value[framing.HEADER_SIZE:]),
                                 written_at)
    packs.delete(txn, raw)
    packs.append_pack(txn, [(raw, record)], written_at)


def edit(txn, raw: bytes, fn) -> None:
    """Replace object `raw`'s stored value by fn(bytearray of it); None deletes it."""
    value = packs.get(txn, raw)
    assert value is not None, raw.hex()
    new = fn(bytearray(value))
    if new is None:
        assert packs.delete(txn, raw)
    else:
        plant(txn, raw, bytes(new))


@contextmanager
def writing(store_dir):
    """A write transaction on the (closed) store at `store_dir`, closed again afterwards."""
    env = open_lmdb(str(store_dir))
    try:
        yield env
    finally:
        env.close()


def edit_at(store_dir, raw: bytes, fn) -> None:
    """`edit` on the closed store at `store_dir`."""
    with writing(store_dir) as env:
        env.write(lambda txn: edit(txn, raw, fn))


def count_packs(txn) -> int:
    return txn.count(packs.PACKS)

