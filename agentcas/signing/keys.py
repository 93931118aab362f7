"""Ed25519 signing keys: generation, key files, key ids.

NAME.key holds the private key as PKCS#8 PEM (encrypted with the passphrase in
AGENTCAS_KEY_PASSPHRASE when that is set), created with mode 0600 and never
overwritten. NAME.pub is one line, `agentcas-ed25519 BASE64(raw 32 bytes) NAME`;
`ssh-ed25519 ...` lines (OpenSSH) are read too. A key id is the first 8 bytes of
the plain BLAKE3 of the raw public key, as 16 hex characters. Every public key read
goes through `curve.check_public_key`, so malformed and small-order keys never pass.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass

import blake3
from cryptography.exceptions import InternalError, InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agentcas.cas.system_errors import from_os_error
from agentcas.errors import ConflictError, IntegrityError, UsageError
from agentcas.result import Result
from agentcas.signing.curve import BadPoint, check_public_key

PASSPHRASE_ENV = "AGENTCAS_KEY_PASSPHRASE"
PUBLIC_PREFIX = "agentcas-ed25519"
KEY_ID_BYTES = 8
MAX_KEY_FILE = 64 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class BadKey(IntegrityError):
    """A key that is malformed, of small order, or cannot be read."""


def check_key_name(name: str) -> str:
    """Key and signer names: 1..64 of A-Z a-z 0-9 . _ -, starting with a letter or digit."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(f"invalid key name {str(name)[:80]!r}: use 1..64 letters, digits, '.', '_' "
                         "or '-', starting with a letter or digit")
    return name


def key_id(public_raw: bytes) -> str:
    """The short id of a raw public key: 16 hex characters of its BLAKE3."""
    return blake3.blake3(bytes(public_raw)).digest(length=KEY_ID_BYTES).hex()


@dataclass(frozen=True)
class PublicKey:
    """A checked Ed25519 public key (never small-order, always canonical)."""

    raw: bytes

    def __post_init__(self):
        try:
            check_public_key(self.raw)
        except BadPoint as exc:
            raise BadKey(str(exc)) from None

    @property
    def id(self) -> str:
        return key_id(self.raw)

    def verify(self, signature: bytes, message: bytes) -> None:
        """Raise cryptography's InvalidSignature unless `signature` is valid for `message`."""
        if len(signature) != 64:
            raise InvalidSignature("an Ed25519 signature is 64 bytes")
        # S must be reduced modulo L (RFC 8032 §5.1.7); OpenSSL checks too, we do not rely on it.
        if int.from_bytes(signature[32:], "little") >= 2**252 + 27742317777372353535851937790883648493:
            raise InvalidSignature("signature scalar is not reduced")
        Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, message)

    def to_line(self, name: str) -> str:
        return f"{PUBLIC_PREFIX} {base64.b64encode(self.raw).decode()} {name}\n"


@dataclass(frozen=True)
class SigningKey:
    """A private key and its public half."""

    private: Ed25519PrivateKey
    public: PublicKey

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def generate() -> SigningKey:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(private, PublicKey(raw))


def _passphrase() -> bytes | None:
    value = os.environ.get(PASSPHRASE_ENV)
    return value.encode("utf-8") if value else None


@dataclass(frozen=True)
class KeyPairFiles(Result):
    """A key pair written (`keygen`): its signer name, key id and the two files' absolute paths."""

    name: str
    key_id: str
    private_key: str   # NAME.key, mode 0600
    public_key: str    # NAME.pub
    encrypted: bool    # the private key is encrypted with $AGENTCAS_KEY_PASSPHRASE


def write_keypair(name: str, out_dir: str, key: SigningKey | None = None) -> KeyPairFiles:
    """Write NAME.key (0600, never overwritten) and NAME.pub into `out_dir`.

    Whole or nothing: if a write fails (a full disk), both files and any directory this
    call made are removed, and the error names the file it was writing.
    """
    check_key_name(name)
    key = key or generate()
    private_path = os.path.join(out_dir, f"{name}.key")
    public_path = os.path.join(out_dir, f"{name}.pub")
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise ConflictError(f"{path} already exists; not overwriting a key")
    passphrase = _passphrase()
    encryption = (serialization.BestAvailableEncryption(passphrase) if passphrase
                  else serialization.NoEncryption())
    pem = key.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    encryption)
    made = _missing_directories(out_dir)
    written, current = [], out_dir
    try:
        for directory in made:
            os.mkdir(directory)
        for current, data, mode in ((private_path, pem, 0o600),
                                    (public_path, key.public.to_line(name).encode(), 0o644)):
            fd = os.open(current, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            written.append(current)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(current, mode)
    except BaseException as exc:
        for path in written:
            try:
                os.unlink(path)
            except OSError:
                pass
        for directory in reversed(made):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise from_os_error(exc, f"writing {current}", "no key was written") from None
        raise
    return KeyPairFiles(name, key.public.id, os.path.abspath(private_path), os.path.abspath(public_path),
                        passphrase is not None)


def _missing_directories(path: str) -> list[str]:
    """The directories `os.makedirs(path)` would create, outermost first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing[::-1]


def _read_small(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE:
        raise BadKey(f"{what} {path} is too large to be a key")
    return data


def load_signing_key(path: str) -> SigningKey:
    """Read NAME.key (decrypting with AGENTCAS_KEY_PASSPHRASE if it is encrypted)."""
    data = _read_small(path, "key file")
    try:
        private = serialization.load_pem_private_key(data, password=_passphrase())
    except TypeError as exc:
        if "encrypted" in str(exc) and _passphrase() is None:
            raise BadKey(f"key file {path} is encrypted: set {PASSPHRASE_ENV}") from None
        raise BadKey(f"key file {path} is not an unencrypted key: {exc}") from None
    except (ValueError, UnsupportedAlgorithm, InternalError) as exc:
        # InternalError: OpenSSL refuses some malformed keys only when building them
        # (an X448 OID with a 32-byte key, found by fuzz/targets.py fuzz_private_key).
        raise BadKey(f"key file {path} is not a readable Ed25519 private key "
                     f"(wrong passphrase or malformed): {str(exc)[:80]}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise BadKey(f"key file {path} holds a {type(private).__name__}, not an Ed25519 key")
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(private, PublicKey(raw))


def parse_public_key(text: bytes, where: str = "public key") -> PublicKey:
    """Parse one `agentcas-ed25519 B64 [NAME]` or `ssh-ed25519 B64 [COMMENT]` line."""
    try:
        line = text.decode("ascii").strip()
    except UnicodeDecodeError:
        raise BadKey(f"{where} is not an ASCII key line") from None
    fields = line.split()
    if len(fields) < 2 or "\n" in line:
        raise BadKey(f"{where} is not a key line ('{PUBLIC_PREFIX} BASE64 NAME')")
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (binascii.Error, ValueError):
        raise BadKey(f"{where} has malformed base64") from None
    if fields[0] == PUBLIC_PREFIX:
        if len(blob) != 32:
            raise BadKey(f"{where} is {len(blob)} bytes; an Ed25519 public key is 32")
        return PublicKey(blob)
    if fields[0] == "ssh-ed25519":
        try:
            loaded = serialization.load_ssh_public_key(line.encode())
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise BadKey(f"{where} is a malformed ssh-ed25519 key: {str(exc)[:80]}") from None
        if not isinstance(loaded, Ed25519PublicKey):
            raise BadKey(f"{where} is not an Ed25519 key")
        return PublicKey(loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    raise BadKey(f"{where} has key type {fields[0][:40]!r}; only {PUBLIC_PREFIX} and ssh-ed25519")


def load_public_key(path: str) -> PublicKey:
    return parse_public_key(_read_small(path, "public key file"), f"public key file {path}")
