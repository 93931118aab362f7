"""Keys, small-order points, signature envelopes, the trust list, `sign` and `verify REV`."""

from __future__ import annotations

import base64
import stat

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentcas.cas.digest import Digest, hash_blob
from agentcas.signing import curve, envelope, keys, trust
from agentcas.signing.keys import BadKey, PublicKey

# RFC 8032 §7.1, TEST 1 (empty message).
RFC_SECRET = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC_SIGNATURE = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")
IDENTITY = bytes.fromhex("01" + "00" * 31)


def _rfc_key() -> keys.SigningKey:
    return keys.SigningKey(Ed25519PrivateKey.from_private_bytes(RFC_SECRET), PublicKey(RFC_PUBLIC))


# --- curve ------------------------------------------------------------------------------------

def test_rfc8032_vector_verifies_and_key_id_is_blake3_prefix():
    key = PublicKey(RFC_PUBLIC)
    key.verify(RFC_SIGNATURE, b"")
    with pytest.raises(InvalidSignature):
        key.verify(RFC_SIGNATURE, b"x")
    assert key.id == hash_blob(RFC_PUBLIC).hex()[:16]
    assert _rfc_key().sign(b"") == RFC_SIGNATURE


@pytest.mark.parametrize("encoded", sorted(curve.SMALL_ORDER_ENCODINGS), ids=lambda e: e.hex()[:8] + f"-{e[31] >> 7}")
def test_every_small_order_encoding_is_refused(encoded):
    with pytest.raises(BadKey):
        PublicKey(encoded)
    # Those that decode at all really are of small order (the list is not made up).
    try:
        curve.decode_point(encoded)
    except curve.BadPoint:
        return
    assert curve.has_small_order(encoded)


def test_computed_small_order_check_catches_points_missing_from_the_list():
    order8 = bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")
    assert curve.has_small_order(order8)
    # has_small_order does not depend on the list: strip it and compute.
    x, y = curve.decode_point(order8)
    point = (x, y)
    for _ in range(3):
        point = curve._add(point, point)
    assert point == (0, 1)


def test_mixed_order_key_is_refused_and_honest_keys_pass():
    honest = keys.generate().public.raw
    PublicKey(honest)
    x, y = curve.decode_point(honest)
    tx, ty = curve.decode_point(bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"))
    mx, my = curve._add((x, y), (tx, ty))
    mixed = (my | ((mx & 1) << 255)).to_bytes(32, "little")
    assert not curve.has_small_order(mixed)
    with pytest.raises(BadKey, match="small-order component"):
        PublicKey(mixed)


@pytest.mark.parametrize("encoded,why", [
    (b"\x00" * 31, "32 bytes"),
    (bytes.fromhex("ef" + "ff" * 30 + "7f"), "canonical"),       # y = p + 2
    (bytes.fromhex("02" + "00" * 31), "not a point"),            # y = 2 has no x
])
def test_malformed_keys_are_refused(encoded, why):
    with pytest.raises(BadKey, match=why):
        PublicKey(encoded)


# --- key files --------------------------------------------------------------------------------

def test_keygen_writes_private_0600_and_public_line(tmp_path, run):
    result = run("keygen", "alice", "--out", tmp_path / "k")
    assert result.code == 0, result
    key_id = result.out.split()[0]
    private, public = tmp_path / "k" / "alice.key", tmp_path / "k" / "alice.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes()
    assert keys.load_public_key(str(public)).id == key_id
    assert keys.load_signing_key(str(private)).public.id == key_id
    again = run("keygen", "alice", "--out", tmp_path / "k")
    assert again.code == 3 and "already exists" in again.err
    assert keys.load_signing_key(str(private)).public.id == key_id


def test_keygen_needs_no_store_and_checks_the_name(tmp_path, run):
    assert run("keygen", "../evil", "--out", tmp_path, cwd=tmp_path).code == 2
    assert run("keygen", "bob", cwd=tmp_path).code == 0
    assert (tmp_path / "bob.key").exists()


def test_passphrase_encrypts_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv(keys.PASSPHRASE_ENV, "correct horse")
    made = keys.write_keypair("enc", str(tmp_path))
    assert made["encrypted"]
    assert b"ENCRYPTED PRIVATE KEY" in (tmp_path / "enc.key").read_bytes()
    assert keys.load_signing_key(str(tmp_path / "enc.key")).public.id == made["key_id"]
    monkeypatch.setenv(keys.PASSPHRASE_ENV, "wrong")
    with pytest.raises(BadKey, match="passphrase"):
        keys.load_signing_key(str(tmp_path / "enc.key"))
    monkeypatch.delenv(keys.PASSPHRASE_ENV)
    with pytest.raises(BadKey, match="encrypted"):
        keys.load_signing_key(str(tmp_path / "enc.key"))


@pytest.mark.parametrize("text", [
    b"", b"garbage", b"agentcas-ed25519 !!!notbase64 x", b"agentcas-ed25519 " + base64.b64encode(b"x" * 31),
    b"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ x", b"\xff\xfe",
    b"agentcas-ed25519 " + base64.b64encode(IDENTITY) + b" id",
])
def test_malformed_public_key_lines_are_refused(text):
    with pytest.raises(BadKey):
        keys.parse_public_key(text)


def test_ssh_ed25519_public_keys_are_read():
    from cryptography.hazmat.primitives import serialization
    private = Ed25519PrivateKey.generate()
    line = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert keys.parse_public_key(line + b" me@host").raw == raw


# --- envelopes --------------------------------------------------------------------------------

CHECKPOINT = Digest(bytes(range(32)))


def _trusted(key: keys.SigningKey, namespaces=(envelope.NAMESPACE_CHECKPOINT,)):
    return [trust.TrustEntry("alice", key.public, tuple(namespaces), "2026-11-29T00:00:00.000000Z")]


def test_statement_bytes_are_pinned():
    key = _rfc_key()
    signed = envelope.sign(key, CHECKPOINT, "main", signed_at="2026-11-29T12:00:00.000000Z")
    assert signed.statement.message() == (
        b'agentcas signed statement v1\n{"checkpoint":"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",'
        b'"format":1,"key_id":"' + PublicKey(RFC_PUBLIC).id.encode() + b'","namespace":"agentcas-checkpoint-v1",'
        b'"signed_at":"2026-11-29T12:00:00.000000Z","thread":"main"}')
    assert envelope.Envelope.decode(signed.encode()) == signed
    # The vectors of docs/FORMAT.md section 10.
    assert PublicKey(RFC_PUBLIC).id == "6c31041268f47160"
    assert signed.signature.hex() == (
        "bcf8c4fea7a8f82e43b9f14ce45f0362bdd4085085531fde211102ce04dedfff"
        "bf72e4794f6cc1242117046f7f94647933a43bd9bf81043e9e733428cc3ae003")
    assert signed.digest().hex() == "41845206e5ceefb092f996f11b968d71507b7ddb18dad2061ba12d0b884be34d"
    verdict = envelope.check(signed, _trusted(key), CHECKPOINT, "main")
    assert verdict.status == envelope.VALID, verdict


@pytest.mark.parametrize("field,value", [
    ("namespace", "agentcas-other-v1"), ("format", 2), ("checkpoint", "ff" * 32), ("thread", "other"),
    ("signed_at", "2030-01-01T00:00:00.000000Z"),
])
def test_any_signed_field_changed_is_invalid(field, value):
    key = keys.generate()
    signed = envelope.sign(key, CHECKPOINT, "main")
    doc = signed.to_doc()
    doc["statement"][field] = value
    from agentcas.cas import encoding
    forged = envelope.Envelope.decode(encoding.encode(doc))
    expected = Digest.parse(value) if field == "checkpoint" else CHECKPOINT
    verdict = envelope.check(forged, _trusted(key), expected, doc["statement"]["thread"])
    assert verdict.status == envelope.INVALID and "does not verify" in verdict.reason


def test_key_id_changed_or_key_swapped_is_invalid():
    key, other = keys.generate(), keys.generate()
    signed = envelope.sign(key, CHECKPOINT, "main")
    swapped = envelope.Envelope(signed.statement, other.public.raw, signed.signature)
    assert envelope.check(swapped, _trusted(other), CHECKPOINT, "main").status == envelope.INVALID
    statement = envelope.Statement(**{**signed.statement.__dict__, "key_id": other.public.id})
    relabelled = envelope.Envelope(statement, other.public.raw, signed.signature)
    assert envelope.check(relabelled, _trusted(other), CHECKPOINT, "main").status == envelope.INVALID


def test_verdicts_untrusted_wrong_namespace_other_checkpoint():
    key = keys.generate()
    signed = envelope.sign(key, CHECKPOINT, "main")
    assert envelope.check(signed, [], CHECKPOINT, "main").status == envelope.UNTRUSTED
    only_other = _trusted(key, ("other-ns",))
    verdict = envelope.check(signed, only_other, CHECKPOINT, "main")
    assert verdict.status == envelope.UNTRUSTED and "namespace" in verdict.reason
    in_other_ns = envelope.sign(key, CHECKPOINT, "main", namespace="other-ns")
    assert envelope.check(in_other_ns, _trusted(key, ("other-ns",)), CHECKPOINT, "main").status == envelope.INVALID
    moved = envelope.check(signed, _trusted(key), Digest(b"\x07" * 32), "main")
    assert moved.status == envelope.INVALID and "moved" in moved.reason
    assert envelope.summarize([]) == (envelope.ABSENT, "no signature")


def test_identity_key_forgery_is_invalid_even_if_trusted():
    # With A = identity, R = identity and S = 0 satisfy [S]B = R + [k]A for every message.
    statement = envelope.Statement(envelope.NAMESPACE_CHECKPOINT, 1, CHECKPOINT, "main", keys.key_id(IDENTITY),
                                   "2026-11-29T00:00:00.000000Z")
    forged = envelope.Envelope(statement, IDENTITY, IDENTITY + bytes(32))
    planted = trust.TrustEntry.__new__(trust.TrustEntry)
    object.__setattr__(planted, "name", "evil")
    object.__setattr__(planted, "public_key", object.__new__(PublicKey))
    object.__setattr__(planted.public_key, "raw", IDENTITY)
    object.__setattr__(planted, "namespaces", (envelope.NAMESPACE_CHECKPOINT,))
    verdict = envelope.check(forged, [planted], CHECKPOINT, "main")
    assert verdict.status == envelope.INVALID and "small-order" in verdict.reason


# --- trust, sign, verify through the CLI ----------------------------------------------------------

@pytest.fixture
def signed_store(tmp_path, run, workspace):
    store = tmp_path / "s"
    assert run("init", store).code == 0
    assert run("commit", workspace, "-m", "one", store=store).code == 0
    assert run("keygen", "alice", "--out", tmp_path / "k").code == 0
    return store, tmp_path / "k"


def test_trust_add_list_remove(signed_store, run, tmp_path):
    store, k = signed_store
    added = run("--json", "trust", "add", "alice", k / "alice.pub", "--namespace", "agentcas-checkpoint-v1",
                "--namespace", "team-x", store=store)
    assert added.code == 0, added
    assert added.json()["namespaces"] == ["agentcas-checkpoint-v1", "team-x"]
    listed = run("--json", "trust", "list", store=store).json()["trusted"]
    assert [(r["name"], r["key_id"]) for r in listed] == [("alice", keys.load_public_key(str(k / "alice.pub")).id)]
    assert run("keygen", "bob", "--out", k).code == 0
    clash = run("trust", "add", "alice", k / "bob.pub", store=store)
    assert clash.code == 3 and "already trusted" in clash.err
    assert run("trust", "remove", "alice", store=store).code == 0
    assert run("--json", "trust", "list", store=store).json()["trusted"] == []
    assert run("trust", "remove", "alice", store=store).code == 1


def test_trust_add_refuses_malformed_and_small_order_keys_and_writes_nothing(signed_store, run, tmp_path):
    from support.store_state import store_rows
    store, _ = signed_store
    bad = tmp_path / "bad.pub"
    before = store_rows(store)
    for content in (b"agentcas-ed25519 " + base64.b64encode(IDENTITY) + b" evil\n",
                    b"agentcas-ed25519 " + base64.b64encode(bytes.fromhex("ec" + "ff" * 30 + "7f")) + b" evil\n",
                    b"not a key\n"):
        bad.write_bytes(content)
        result = run("trust", "add", "evil", bad, store=store)
        assert result.code == 4, result
        assert "Traceback" not in result.err
    bad.write_bytes(b"agentcas-ed25519 " + base64.b64encode(IDENTITY) + b" evil\n")
    assert "small-order" in run("trust", "add", "evil", bad, store=store).err
    assert run("trust", "add", "x", tmp_path / "absent.pub", store=store).code == 2
    assert run("trust", "add", "alice", tmp_path / "k" / "alice.pub", "--namespace", "Bad NS", store=store).code == 4
    assert store_rows(store) == before


def test_sign_and_verify_rev(signed_store, run):
    store, k = signed_store
    absent = run("verify", "main", store=store)
    assert absent.code == 4 and "absent" in absent.err
    signed = run("--json", "sign", "main", "--key", k / "alice.key", store=store)
    assert signed.code == 0, signed
    assert signed.json()["namespace"] == "agentcas-checkpoint-v1"
    untrusted = run("verify", "main", store=store)
    assert untrusted.code == 4 and "untrusted" in untrusted.err
    assert run("trust", "add", "alice", k / "alice.pub", store=store).code == 0
    ok = run("--json", "verify", "main", store=store)
    assert ok.code == 0, ok
    assert ok.json()["signatures"][0]["signer"] == "alice"
    assert run("trust", "remove", "alice", store=store).code == 0
    assert run("trust", "add", "alice", k / "alice.pub", "--namespace", "other-ns", store=store).code == 0
    wrong_ns = run("verify", "main", store=store)
    assert wrong_ns.code == 4 and "namespace" in wrong_ns.err
    assert run("verify", "nosuchthing", store=store).code == 1


def test_tampered_stored_signature_is_detected(signed_store, run):
    from support.store_state import store_rows
    store, k = signed_store
    assert run("sign", "main", "--key", k / "alice.key", store=store).code == 0
    assert run("trust", "add", "alice", k / "alice.pub", store=store).code == 0
    rows = store_rows(store)
    (sig_key,) = [key for (table, key) in rows if table == "signatures"]
    from support import raw_objects

    def damage(value: bytearray):
        value[-5] ^= 0x01
        return value
    raw_objects.edit_at(store, sig_key[32:], damage)
    result = run("verify", "main", store=store)
    assert result.code == 4 and "Traceback" not in result.err


def test_planted_small_order_trust_row_is_refused_at_use(store, workspace):
    from agentcas.cas import encoding
    from agentcas.cas.sealed import seal
    store.checkpoints.commit(str(workspace), "one")
    doc = {"name": "evil", "public_key": IDENTITY.hex(), "key_id": keys.key_id(IDENTITY),
           "namespaces": [envelope.NAMESPACE_CHECKPOINT], "added_at": "2026-11-29T00:00:00.000000Z"}
    store.environment.write(lambda txn: txn.put("trust", b"evil", seal("trust", b"evil", encoding.encode(doc))))
    with pytest.raises(Exception) as info:
        store.trust.verify("main")
    assert getattr(info.value, "exit_code", None) == 4
    assert "small-order" in str(info.value)


def test_verify_thread_refuses_a_signature_made_for_another_thread(signed_store, run):
    """A signature binds a thread; verify THREAD checks that thread."""
    store, k = signed_store
    assert run("branch", "other", "main", store=store).code == 0
    assert run("sign", "other", "--key", k / "alice.key", store=store).code == 0
    assert run("trust", "add", "alice", k / "alice.pub", store=store).code == 0
    assert run("verify", "other", store=store).code == 0
    wrong = run("verify", "main", store=store)
    assert wrong.code == 4, wrong
    assert "invalid" in wrong.err and "'other'" in wrong.err and "'main'" in wrong.err
    # A checkpoint id names its own thread (main), which was not signed either.
    cp = run("--json", "show", "main", store=store).json()["checkpoint"]
    assert run("verify", cp, store=store).code == 4


def test_verify_accepts_the_bundle_thread_of_an_import_as(signed_store, run, tmp_path):
    """`import --as NEW` keeps the signer's thread: verify NEW accepts it (recorded in imports)."""
    store, k = signed_store
    bundle = tmp_path / "b.bundle"
    assert run("export", "main", "-o", bundle, "--sign", k / "alice.key", store=store).code == 0
    dst = tmp_path / "dst"
    assert run("init", dst).code == 0
    assert run("trust", "add", "alice", k / "alice.pub", store=dst).code == 0
    assert run("import", bundle, "--as", "from-alice", store=dst).code == 0
    assert run("verify", "from-alice", store=dst).code == 0
    assert run("branch", "copy", "from-alice", store=dst).code == 0
    copied = run("verify", "copy", store=dst)
    assert copied.code == 4 and "'main'" in copied.err
