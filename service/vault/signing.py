"""Asymmetric signing keys derived from the vault's keys: the client's key for `private_key_jwt` (RFC 7523).

Each key of the ring yields one P-256 key per purpose: HKDF-SHA256(key, info=b"connector/ec-p256/" + purpose),
48 bytes, reduced into [1, n-1] (FIPS 186-5 A.2.1, "extra random bits"). Nothing is stored: every replica with the
same ring derives the same keys, the primary key's signs, and every key still in the ring publishes its public half
(the overlap of a rotation: a provider that cached the old public key keeps verifying until the old key is retired).
The private keys never leave this module but as `cryptography` key objects, whose repr shows no key material.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .ring import KeyRing

_INFO_PREFIX = b"connector/ec-p256/"
# The order of the P-256 group (SEC 2, secp256r1 n).
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def derive_ec_key(ring: KeyRing, key_id: str, purpose: str) -> ec.EllipticCurvePrivateKey:
    """The P-256 private key that ring key `key_id` yields for `purpose` (VaultError for an unknown key id)."""
    if not purpose:
        raise ValueError("a derived key needs a non-empty purpose")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=_INFO_PREFIX + purpose.encode("utf-8"))
    seed = int.from_bytes(hkdf.derive(ring._material(key_id)._bytes), "big")
    return ec.derive_private_key(seed % (_P256_ORDER - 1) + 1, ec.SECP256R1())


def derived_keys(ring: KeyRing, purpose: str) -> list[tuple[str, ec.EllipticCurvePrivateKey]]:
    """(vault key id, derived key) for every key of the ring, the primary's first."""
    ids = [ring.primary_key_id, *(k for k in ring.key_ids if k != ring.primary_key_id)]
    return [(key_id, derive_ec_key(ring, key_id, purpose)) for key_id in ids]
