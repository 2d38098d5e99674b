"""`Vault`: encrypting, decrypting, signing and verifying with a key ring (AES-256-GCM with associated data; HMAC
on HKDF subkeys). New data always uses the primary key."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from service.core.errors import VaultError

from .ring import NONCE_BYTES, KeyRing, _b64url, _KeyMaterial
from .signing import derived_keys

_TAG_BYTES = 16
_SIGN_INFO_PREFIX = b"connector/"


class Vault:
    """Encrypts, decrypts, signs and verifies with a key ring. New data always uses the primary key."""

    __slots__ = ("_aead", "_ring", "_subkeys")

    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring
        self._aead: dict[str, AESGCM] = {}
        self._subkeys: dict[tuple[str, str], _KeyMaterial] = {}

    @property
    def ring(self) -> KeyRing:
        return self._ring

    @property
    def primary_key_id(self) -> str:
        return self._ring.primary_key_id

    def _cipher(self, key_id: str) -> AESGCM:
        cipher = self._aead.get(key_id)
        if cipher is None:
            cipher = AESGCM(self._ring._material(key_id)._bytes)
            self._aead[key_id] = cipher
        return cipher

    def encrypt(self, plaintext: bytes, *, aad: bytes) -> tuple[str, bytes]:
        """Encrypt under the primary key: returns (key id, 12-byte nonce || ciphertext || 16-byte tag)."""
        key_id = self._ring.primary_key_id
        nonce = os.urandom(NONCE_BYTES)
        return key_id, nonce + self._cipher(key_id).encrypt(nonce, plaintext, aad)

    def decrypt(self, key_id: str, blob: bytes, *, aad: bytes) -> bytes:
        """Decrypt a blob from `encrypt`. VaultError if the key id is unknown, the blob was tampered with,
        or the associated data differs (the ciphertext was moved to another row)."""
        cipher = self._cipher(key_id)
        if len(blob) < NONCE_BYTES + _TAG_BYTES:
            raise VaultError(f"ciphertext does not decrypt under key {key_id}: it is truncated")
        try:
            return cipher.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
        except InvalidTag:
            raise VaultError(f"ciphertext does not decrypt under key {key_id}") from None

    def encrypt_json(self, obj: Any, *, aad: bytes) -> tuple[str, bytes]:
        """Encrypt a JSON-serialisable value (compact UTF-8 JSON)."""
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        return self.encrypt(data, aad=aad)

    def decrypt_json(self, key_id: str, blob: bytes, *, aad: bytes) -> Any:
        data = self.decrypt(key_id, blob, aad=aad)
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise VaultError(f"ciphertext under key {key_id} decrypts to something that is not JSON") from None

    def reencrypt(self, key_id: str, blob: bytes, *, aad: bytes) -> tuple[str, bytes]:
        """Decrypt with `key_id` and encrypt again under the primary key (lazy rotation)."""
        return self.encrypt(self.decrypt(key_id, blob, aad=aad), aad=aad)

    def needs_rotation(self, key_id: str) -> bool:
        """True when data under `key_id` should be re-encrypted under the primary key."""
        return key_id != self._ring.primary_key_id

    def _subkey(self, key_id: str, purpose: str) -> bytes:
        cached = self._subkeys.get((key_id, purpose))
        if cached is None:
            hkdf = HKDF(
                algorithm=hashes.SHA256(),
                length=32,
                salt=None,
                info=_SIGN_INFO_PREFIX + purpose.encode("utf-8"),
            )
            cached = _KeyMaterial(hkdf.derive(self._ring._material(key_id)._bytes))
            self._subkeys[(key_id, purpose)] = cached
        return cached._bytes

    def _mac(self, key_id: str, purpose: str, data: bytes) -> str:
        return _b64url(hmac.new(self._subkey(key_id, purpose), data, hashlib.sha256).digest())

    def sign(self, purpose: str, data: bytes) -> str:
        """HMAC-SHA256 of `data` under the primary key's subkey for `purpose`: ``"KID.<base64url mac>"``.

        Subkeys are HKDF-SHA256(key, info=b"connector/" + purpose), so a signature made for one purpose never
        verifies for another.
        """
        if not purpose:
            raise ValueError("sign needs a non-empty purpose")
        key_id = self._ring.primary_key_id
        return f"{key_id}.{self._mac(key_id, purpose, data)}"

    def verify(self, purpose: str, data: bytes, signature: str) -> bool:
        """True if `signature` is `sign(purpose, data)` by any key in the ring. Never raises on bad input."""
        if not purpose or not isinstance(signature, str) or not signature.isascii():
            return False
        key_id, sep, mac = signature.partition(".")
        if not sep or key_id not in self._ring:
            return False
        expected = self._mac(key_id, purpose, data)
        return hmac.compare_digest(expected.encode("ascii"), mac.encode("ascii"))

    def signing_keys(self, purpose: str) -> list[tuple[str, ec.EllipticCurvePrivateKey]]:
        """The P-256 keys every key of the ring yields for `purpose` (the primary's first; see `signing.py`):
        the primary's signs, all of them publish their public half."""
        return derived_keys(self._ring, purpose)

    def __repr__(self) -> str:
        return f"Vault(primary_key_id={self._ring.primary_key_id!r}, key_ids={self._ring.key_ids!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a vault cannot be pickled")
