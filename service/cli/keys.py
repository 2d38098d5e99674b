"""`acp-connector keys ...`: token-encryption keys."""

from __future__ import annotations

from ..vault import generate_key
from .framework import Commands, Invocation, UsageError


def register(commands: Commands) -> None:
    keys = commands.group(
        "keys",
        help="token-encryption keys (vault)",
        description=(
            "Keys of the vault that encrypts every stored token (AES-256-GCM). Keys are given to the\n"
            "connector as CONNECTOR_VAULT__KEYS or in the file vault.key_file, one KID:BASE64URL per entry;\n"
            "the first (or vault.primary_key_id) encrypts, the others still decrypt."
        ),
    )
    generate = keys.command(
        "generate",
        run_generate,
        help="print a new key as KID:BASE64URL",
        description=(
            "Print a new random 256-bit key as KID:BASE64URL on stdout. Nothing is stored: put the line in\n"
            "CONNECTOR_VAULT__KEYS or the key file (before the old key, to make it the one that encrypts)."
        ),
        examples=["acp-connector keys generate", "acp-connector keys generate --key-id k-2025-q3"],
    )
    generate.add_argument(
        "--key-id", metavar="KID", help="key id: letters, digits, '-' or '_', at most 64 (default: k-YYYYMMDD-xxxx)"
    )


def run_generate(invocation: Invocation) -> int:
    try:
        key = generate_key(invocation.args.key_id)
    except ValueError:
        raise UsageError(
            f"keys generate: invalid --key-id {invocation.args.key_id!r}",
            "use letters, digits, '-' or '_', at most 64 characters",
        ) from None
    invocation.out(key)
    return 0
