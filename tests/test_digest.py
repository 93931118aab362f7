"""Digest: 32 raw bytes, hex for people, b3sum-compatible blob ids, per-kind contexts."""

import shutil
import subprocess

import blake3
import pytest

from agentcas.cas.digest import (
    EMPTY,
    EMPTY_HISTORY,
    OBJECT_CONTEXTS,
    PREFIX_CHAIN_CONTEXT,
    Digest,
    DigestMismatch,
    chain_prefix,
    hash_blob,
    hash_object,
)
from agentcas.errors import IntegrityError, UsageError

HELLO = b"hello\n"
HELLO_DIGEST = "8e4c7c1b99dbfd50e7a95185fead5ee1448fa904a2fdd778eaf5f2dbfd629a99"
EMPTY_BLOB_DIGEST = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


def test_blob_ids_are_plain_blake3():
    assert hash_blob(HELLO).hex() == HELLO_DIGEST
    assert EMPTY.hex() == EMPTY_BLOB_DIGEST
    assert hash_blob(memoryview(HELLO)) == hash_blob(bytearray(HELLO))


@pytest.mark.skipif(shutil.which("b3sum") is None, reason="b3sum is not installed")
def test_blob_id_equals_b3sum(tmp_path):
    path = tmp_path / "hello.txt"
    path.write_bytes(HELLO)
    out = subprocess.run(["b3sum", "--no-names", str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == HELLO_DIGEST


def test_parse_round_trip_and_rejects():
    d = Digest.parse(HELLO_DIGEST)
    assert d.raw == bytes.fromhex(HELLO_DIGEST) and d.hex() == HELLO_DIGEST and str(d) == HELLO_DIGEST
    assert d.short() == HELLO_DIGEST[:12]
    for bad in [HELLO_DIGEST.upper(), HELLO_DIGEST[:-1], HELLO_DIGEST + "0", "g" * 64, "", None, 5,
                " " + HELLO_DIGEST[1:]]:
        with pytest.raises(UsageError):
            Digest.parse(bad)


def test_raw_must_be_32_bytes():
    for bad in [b"", b"x" * 31, b"x" * 33, "x" * 32, bytearray(32)]:
        with pytest.raises(ValueError):
            Digest(bad)
    assert Digest(bytes(32)) == EMPTY_HISTORY


def test_digest_is_frozen_hashable_ordered():
    a, b = Digest(bytes(32)), Digest(b"\x01" * 32)
    assert a < b and len({a, Digest(bytes(32))}) == 1
    with pytest.raises(AttributeError):
        a.raw = b"y" * 32


def test_object_kinds_never_collide_with_blobs_or_each_other():
    body = b'{"entries":[]}'
    ids = {hash_object(kind, body) for kind in OBJECT_CONTEXTS}
    assert len(ids) == len(OBJECT_CONTEXTS)
    assert hash_blob(body) not in ids
    assert len(set(OBJECT_CONTEXTS.values()) | {PREFIX_CHAIN_CONTEXT}) == len(OBJECT_CONTEXTS) + 1
    for kind, context in OBJECT_CONTEXTS.items():
        assert hash_object(kind, body).raw == blake3.blake3(body, derive_key_context=context).digest()


def test_chain_prefix_definition():
    record = b'{"role":"user"}\n'
    d1 = chain_prefix(EMPTY_HISTORY, blake3.blake3(record).digest())
    expected = blake3.blake3(bytes(32) + blake3.blake3(record).digest(),
                             derive_key_context=PREFIX_CHAIN_CONTEXT).digest()
    assert d1.raw == expected
    assert d1.hex() == "babc78cd72cc9f15e5e8de1f69a1e3042c43e9dae851090d3ca38deaf2cc6642"


def test_digest_mismatch_is_an_integrity_error_naming_both():
    exc = DigestMismatch(EMPTY, EMPTY_HISTORY, "chunk")
    assert isinstance(exc, IntegrityError) and exc.exit_code == 4
    assert EMPTY.hex() in str(exc) and EMPTY_HISTORY.hex() in str(exc)
