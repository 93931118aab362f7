"""A shared store's objects where they live in S3: in a pack (found through the index in
PostgreSQL) or, in a store made before packs, alone under objects/. For tests that damage
or lose one object in the bucket."""

from __future__ import annotations

from agentcas.cas.blobstore.s3_packs import INDEX, location_of
from agentcas.cas.metastore.postgres import PostgresMetadataStore


def object_place(store_url: str, refs_url: str, object_id: str) -> tuple[str, str, int, int]:
    """(bucket, S3 key, offset, length) of the object's stored bytes."""
    bucket, _, prefix = store_url[len("s3://"):].partition("/")
    raw = bytes.fromhex(object_id)
    meta = PostgresMetadataStore(refs_url)
    try:
        row = meta.read_many(INDEX, [raw]).get(raw)
    finally:
        meta.close()
    assert row is not None, f"object {object_id} is not in the pack index"
    where = location_of(raw, row)
    return bucket, f"{prefix}/packs/{where.pack.hex()}", where.offset, where.length


def flip_byte(s3_server, store_url: str, refs_url: str, object_id: str, at: int, mask: int = 0x01) -> None:
    """Flip bits of byte `at` (from the object's end if negative) of the object's stored bytes."""
    bucket, key, offset, length = object_place(store_url, refs_url, object_id)
    client = s3_server.client()
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[offset + (at % length)] ^= mask
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))


def lose_object(store_url: str, refs_url: str, object_id: str) -> None:
    """The bucket loses the object: its index row goes (its bytes stay in a pack, unnamed)."""
    object_place(store_url, refs_url, object_id)
    meta = PostgresMetadataStore(refs_url)
    try:
        meta.exchange(writes=[(INDEX, bytes.fromhex(object_id), None)])
    finally:
        meta.close()
