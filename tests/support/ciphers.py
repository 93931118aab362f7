"""An AES-GCM cipher for LangGraph's EncryptedSerializer (the tests' encrypted threads)."""

from __future__ import annotations

import os

from langgraph.checkpoint.serde.base import CipherProtocol  # noqa: E402


class AesGcm(CipherProtocol):
    def __init__(self, key: bytes):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        self.aead = AESGCM(key)

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        nonce = os.urandom(12)
        return "aesgcm", nonce + self.aead.encrypt(nonce, plaintext, None)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "aesgcm"
        return self.aead.decrypt(ciphertext[:12], ciphertext[12:], None)
