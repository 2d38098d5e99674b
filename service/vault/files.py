"""The key files an operator keeps: the configured ring loaded, a retired key removed, a development file made."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from service.core.errors import VaultError

from .ring import KeyRing, _KeyMaterial, _parse_entry, _read_key_file, generate_key

logger = logging.getLogger("service.vault")


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
