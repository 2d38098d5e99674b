"""The token vault: owns all key material. AES-256-GCM with key ids and associated data; HMAC signing.

Keys are 32 random bytes, written as ``KID:BASE64URL``. A key ring holds several keys; the primary key
encrypts and signs new data, every key in the ring still decrypts and verifies, so keys rotate by putting a
new key first and re-encrypting lazily (see `Vault.needs_rotation`). Associated data binds a ciphertext to
the row it belongs to (`service.core.handles`): a ciphertext copied to another row does not decrypt.

Nothing in this package puts key material in a repr, an exception message or a log line. One module a job:
ring.py (keys, the ring, reading entries and key files), cipher.py (`Vault`), files.py (the key files kept).
"""

from __future__ import annotations

from .cipher import Vault
from .files import ensure_dev_key_file, load_key_ring, remove_from_key_file
from .ring import KEY_BYTES, NONCE_BYTES, KeyRing, generate_key

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "KeyRing",
    "Vault",
    "ensure_dev_key_file",
    "generate_key",
    "load_key_ring",
    "remove_from_key_file",
]
