"""The key ring: named AES-256 keys, one of them primary, read from ``KID:BASE64URL`` entries or a key file.

Nothing here puts key material in a repr, an exception message or a log line: the bytes stay behind `_KeyMaterial`.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.core.errors import VaultError

KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
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


def generate_key(key_id: str | None = None) -> str:
    """A new random key as ``"KID:BASE64URL"``; the default key id is ``k-YYYYMMDD-<4 hex>`` (today, UTC)."""
    if key_id is None:
        key_id = f"k-{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(2)}"
    elif not _valid_key_id(key_id):
        raise ValueError(f"invalid key id: expected {_KEY_FORM}")
    return f"{key_id}:{_b64url(secrets.token_bytes(KEY_BYTES))}"
