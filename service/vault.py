"""The token vault: owns all key material. AES-256-GCM with key ids and associated data; HMAC signing.

Keys are 32 random bytes, written as ``KID:BASE64URL``. A key ring holds several keys; the primary key
encrypts and signs new data, every key in the ring still decrypts and verifies, so keys rotate by putting a
new key first and re-encrypting lazily (see `Vault.needs_rotation`). Associated data binds a ciphertext to
the row it belongs to (`service.core.handles`): a ciphertext copied to another row does not decrypt.

Nothing in this module puts key material in a repr, an exception message or a log line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

from service.core.errors import VaultError

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

logger = logging.getLogger(__name__)

KEY_BYTES = 32
NONCE_BYTES = 12
_TAG_BYTES = 16
_KEY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_SIGN_INFO_PREFIX = b"connector/"
_KEY_FORM = "KID:BASE64URL (KID: letters, digits, '-' or '_', at most 64; the key: 32 bytes in base64url)"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _valid_key_id(key_id: str) -> bool:
    return _KEY_ID_RE.fullmatch(key_id) is not None


class _KeyMaterial:
    """32 key bytes behind a repr that never shows them (tracebacks with locals, debuggers)."""

    __slots__ = ("_bytes",)

    def __init__(self, raw: bytes) -> None:
        self._bytes = raw

    def __repr__(self) -> str:
        return "<key material>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _KeyMaterial):
            return NotImplemented
        return hmac.compare_digest(self._bytes, other._bytes)

    def __hash__(self) -> int:
        return id(self)

    def __reduce__(self) -> Any:
        raise TypeError("key material cannot be pickled")


def _parse_entry(entry: str, where: str) -> tuple[str, _KeyMaterial]:
    """Parse one ``KID:BASE64URL`` entry. `where` names it in errors ("key entry 2", "<file> line 3").

    Errors never repeat the entry: a malformed entry may be a bare key.
    """
    key_id, sep, encoded = entry.strip().partition(":")
    key_id, encoded = key_id.strip(), encoded.strip()
    if not sep or not encoded:
        raise VaultError(f"{where} is not in the form {_KEY_FORM}")
    if not _valid_key_id(key_id):
        raise VaultError(f"{where} has an invalid key id: expected {_KEY_FORM}")
    padded = encoded + "=" * (-len(encoded) % 4)
    try:
        raw = base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise VaultError(f"{where} (key id '{key_id}') is not valid base64url") from None
    if len(raw) != KEY_BYTES:
        raise VaultError(f"{where} (key id '{key_id}') is {len(raw)} bytes long, expected {KEY_BYTES}")
    return key_id, _KeyMaterial(raw)


class KeyRing:
    """An immutable set of named AES-256 keys, one of them primary. Its repr shows key ids only."""

    __slots__ = ("_keys", "_primary")

    def __init__(self, keys: Iterable[tuple[str, _KeyMaterial]], primary_key_id: str | None = None) -> None:
        collected: dict[str, _KeyMaterial] = {}
        for key_id, material in keys:
            known = collected.get(key_id)
            if known is not None and known != material:
                raise VaultError(f"key id '{key_id}' is configured twice with different keys")
            collected[key_id] = material
        if not collected:
            raise VaultError("the key ring is empty: configure at least one key (generate one with generate_key)")
        if primary_key_id is None:
            primary_key_id = next(iter(collected))
        elif primary_key_id not in collected:
            raise VaultError(
                f"primary key id '{primary_key_id}' is not in the key ring (key ids: {', '.join(collected)})"
            )
        self._keys = collected
        self._primary = primary_key_id

    @classmethod
    def from_strings(cls, entries: Sequence[str], primary_key_id: str | None = None) -> KeyRing:
        """Build from ``KID:BASE64URL`` entries; the first is primary unless `primary_key_id` says."""
        return cls(
            (_parse_entry(entry, f"key entry {index}") for index, entry in enumerate(entries, start=1)),
            primary_key_id,
        )

    @classmethod
    def from_file(cls, path: Path, primary_key_id: str | None = None) -> KeyRing:
        """Read one ``KID:BASE64URL`` entry per line (blank lines, ``#`` comments skipped); first is primary.

        The file must be a regular file with no permissions for group or others (``chmod 600``).
        """
        return cls(_read_key_file(path), primary_key_id)

    @property
    def primary_key_id(self) -> str:
        return self._primary

    @property
    def key_ids(self) -> tuple[str, ...]:
        """All key ids, in configuration order."""
        return tuple(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def _material(self, key_id: str) -> _KeyMaterial:
        try:
            return self._keys[key_id]
        except KeyError:
            raise VaultError(
                f"unknown key id '{key_id}': it is not in the key ring (key ids: {', '.join(self._keys)}); "
                "add the retired key back to the ring to read this data"
            ) from None

    def __repr__(self) -> str:
        return f"KeyRing(primary_key_id={self._primary!r}, key_ids={self.key_ids!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a key ring cannot be pickled")


def _read_key_file(path: Path) -> list[tuple[str, _KeyMaterial]]:
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY)  # symlinks are followed (Kubernetes secret volumes); the target is checked
    except FileNotFoundError:
        raise VaultError(f"key file {name} does not exist") from None
    except OSError as exc:
        raise VaultError(f"key file {name} cannot be opened: {exc.strerror or type(exc).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise VaultError(f"key file {name} is not a regular file")
        if os.name == "posix" and info.st_mode & 0o077:
            raise VaultError(
                f"key file {name} is accessible by group or others (mode {stat.S_IMODE(info.st_mode):04o}): "
                f"run `chmod 600 {name}`"
            )
        with os.fdopen(os.dup(fd), "r", encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise VaultError(f"key file {name} is not UTF-8 text") from None
    finally:
        os.close(fd)
    entries: list[tuple[str, _KeyMaterial]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if content:
            entries.append(_parse_entry(content, f"key file {name} line {number}"))
    if not entries:
        raise VaultError(f"key file {name} holds no keys")
    return entries


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

    def __repr__(self) -> str:
        return f"Vault(primary_key_id={self._ring.primary_key_id!r}, key_ids={self._ring.key_ids!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a vault cannot be pickled")


def generate_key(key_id: str | None = None) -> str:
    """A new random key as ``"KID:BASE64URL"``; the default key id is ``k-YYYYMMDD-<4 hex>`` (today, UTC)."""
    if key_id is None:
        key_id = f"k-{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(2)}"
    elif not _valid_key_id(key_id):
        raise ValueError(f"invalid key id: expected {_KEY_FORM}")
    return f"{key_id}:{_b64url(secrets.token_bytes(KEY_BYTES))}"


def load_key_ring(keys: Sequence[str | SecretStr], key_file: Path | None, primary_key_id: str | None) -> KeyRing | None:
    """Build the configured key ring: inline `keys` first, then the entries of `key_file`.

    The first key is primary unless `primary_key_id` names another. None when neither keys nor a file are
    configured.
    """
    entries: list[tuple[str, _KeyMaterial]] = [
        _parse_entry(key.get_secret_value() if isinstance(key, SecretStr) else key, f"vault.keys entry {index}")
        for index, key in enumerate(keys, start=1)
    ]
    if key_file is not None:
        entries.extend(_read_key_file(key_file))
    if not entries:
        if primary_key_id is not None:
            raise VaultError(f"vault.primary_key_id is '{primary_key_id}' but no vault keys are configured")
        return None
    return KeyRing(entries, primary_key_id)


def remove_from_key_file(path: Path, key_id: str) -> bool:
    """Rewrite the key file without the entry of `key_id` (comments and other keys kept, mode 0600, atomically).

    False when the file holds no such entry. Refuses to leave the file without any key.
    """
    if key_id not in {kid for kid, _ in _read_key_file(path)}:
        return False
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if line.split("#", 1)[0].strip().partition(":")[0].strip() != key_id]
    if not any(line.split("#", 1)[0].strip() for line in kept):
        raise VaultError(f"key file {path} would hold no key without '{key_id}'")
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.writelines(kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return True


def ensure_dev_key_file(path: Path) -> bool:
    """Create a development key file holding one new key (mode 0600, parent directories created).

    True if the file was created, False if it already existed (it is left untouched).
    """
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return False
    entry = generate_key()
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if os.name == "posix":
                os.fchmod(handle.fileno(), 0o600)  # the umask can only clear bits, but be explicit
            handle.write(
                f"# Connector vault keys for development, created {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.\n"
                "# Keep this file secret (mode 0600). One KID:BASE64URL key per line: the first encrypts\n"
                "# new data, the others still decrypt. Losing it makes the stored tokens unreadable.\n"
                f"{entry}\n"
            )
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    logger.info("created development key file %s (key id %s)", path, entry.partition(":")[0])
    return True
