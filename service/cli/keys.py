"""`acp-connector keys ...`: token-encryption keys: generate, status, rotate, retire; the public JWKS of the
private_key_jwt signing keys derived from them (jwks)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .framework import CliError, Commands, Invocation, UsageError

if TYPE_CHECKING:
    from ..config import Settings
    from ..rotation import RotationReport
    from ..store import Store
    from ..vault import KeyRing, Vault

DEFAULT_BATCH_SIZE = 100


def register(commands: Commands) -> None:
    keys = commands.group(
        "keys",
        help="token-encryption keys (vault)",
        description=(
            "Keys of the vault that encrypts every stored token (AES-256-GCM). Keys are given to the\n"
            "connector as CONNECTOR_VAULT__KEYS or in the file vault.key_file, one KID:BASE64URL per entry;\n"
            "the first (or vault.primary_key_id) is the active key and encrypts, the others still decrypt.\n"
            "To rotate: generate, roll the new key out as active everywhere, `rotate`, then `retire` the old one."
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
    keys.command(
        "status",
        run_status,
        help="list the keys, which is active, and what each still encrypts",
        description=(
            "One line per key id, configured or found in the database: whether it is the active key, in the\n"
            "ring only to decrypt, or missing from the ring; how many grants and webhook signing secrets it\n"
            "encrypts, and how many sign-ins in progress (flows, verifications) hold a secret under it. Reads\n"
            "the database; changes nothing. Exit code 1 when a grant or webhook secret is under a key that is\n"
            "not in the ring."
        ),
        examples=["acp-connector keys status"],
    )
    rotate = keys.command(
        "rotate",
        run_rotate,
        help="re-encrypt every grant and webhook secret under the active key",
        description=(
            "Re-encrypt every grant, then every webhook endpoint's signing secret, not yet under the active key,\n"
            "in batches (one transaction each). Safe to interrupt and run again: it carries on where it stopped.\n"
            "Safe while replicas serve, once every replica has the active key in its ring: a grant a replica\n"
            "refreshes meanwhile keeps its new tokens and is picked up again. Tokens and webhook secrets do not\n"
            "change (receivers keep verifying with the secret they hold). Exit code 1 when some grant or\n"
            "webhook secret cannot be decrypted with this ring."
        ),
        examples=["acp-connector keys rotate", "acp-connector keys rotate --batch-size 500 --pause 0.1"],
    )
    rotate.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"grants or webhook secrets per transaction (default: {DEFAULT_BATCH_SIZE})",
    )
    rotate.add_argument(
        "--pause", type=float, default=0.0, metavar="SECONDS", help="wait between batches, to spare a busy database"
    )
    retire = keys.command(
        "retire",
        run_retire,
        help="retire a key that nothing uses any more",
        description=(
            "Refuse while any grant, webhook signing secret or sign-in in progress is encrypted under KEY_ID,\n"
            "or while it is the active key. Otherwise record a key_retired audit event and take it out of\n"
            "vault.key_file when it is there; a key given in CONNECTOR_VAULT__KEYS must then be removed there by\n"
            "the operator. On SQLite, then checkpoint the write-ahead log and truncate it (run again for a key\n"
            "already retired, it does only this)."
        ),
        examples=["acp-connector keys retire k-20250101-ab12"],
    )
    retire.add_argument("key_id", metavar="KEY_ID", help="the key id to retire")
    keys.command(
        "jwks",
        run_jwks,
        help="print the public JWKS of the connector's private_key_jwt signing keys",
        description=(
            "Print, as JSON, the public keys a provider verifies the connector's private_key_jwt client\n"
            "assertions with: one ES256 key per vault key, derived from it (the active key's signs). The\n"
            "connector serves the same document at <public_base_url>/.well-known/jwks.json; paste this output\n"
            "where a provider takes keys rather than a JWKS URL. A new active vault key adds a key here: paste\n"
            "again before the old vault key is retired. No private key is ever printed."
        ),
        examples=["acp-connector keys jwks"],
    )


def run_generate(invocation: Invocation) -> int:
    from ..vault import generate_key

    try:
        key = generate_key(invocation.args.key_id)
    except ValueError:
        raise UsageError(
            f"keys generate: invalid --key-id {invocation.args.key_id!r}",
            "use letters, digits, '-' or '_', at most 64 characters",
        ) from None
    invocation.out(key)
    return 0


def run_jwks(invocation: Invocation) -> int:
    import json

    from ..oauth import ClientKeys

    invocation.out(json.dumps(ClientKeys(_vault(invocation.settings())).jwks(), indent=2))
    return 0


def _vault(settings: Settings) -> Vault:
    """The configured vault; on a loopback deployment without keys, the development key file `serve` created."""
    from ..bootstrap import DEVELOPMENT_KEY_FILE
    from ..factories import build_vault

    if not settings.vault.keys and settings.vault.key_file is None and settings.is_loopback_deployment:
        if DEVELOPMENT_KEY_FILE.exists():
            settings = settings.model_copy(
                update={"vault": settings.vault.model_copy(update={"key_file": DEVELOPMENT_KEY_FILE})}
            )
    return build_vault(settings)


def _state(ring: KeyRing, key_id: str) -> str:
    if key_id == ring.primary_key_id:
        return "active"
    return "decrypt only" if key_id in ring else "not in the ring"


def run_status(invocation: Invocation) -> int:
    from ..rotation import KeyUsage, key_usage

    settings = invocation.settings()
    ring = _vault(settings).ring
    usage = invocation.with_store(lambda store: key_usage(store, datetime.now(UTC)))
    rows = [("KEY ID", "STATE", "GRANTS", "WEBHOOK SECRETS", "SIGN-INS IN PROGRESS")]
    for key_id in dict.fromkeys([*ring.key_ids, *usage]):
        used = usage.get(key_id, KeyUsage())
        in_progress = used.open_flows + used.open_verifications
        rows.append((key_id, _state(ring, key_id), str(used.grants), str(used.webhook_secrets), str(in_progress)))
    invocation.table(rows)
    lost = [key_id for key_id, used in usage.items() if key_id not in ring and (used.grants or used.webhook_secrets)]
    if lost:
        invocation.note(
            f"grants or webhook secrets under {', '.join(lost)} cannot be read: add the key back to the ring"
        )
        return 1
    return 0


def run_rotate(invocation: Invocation) -> int:
    from ..rotation import rotate_grants, rotate_webhook_secrets

    args = invocation.args
    if args.batch_size < 1 or args.pause < 0:
        raise UsageError("keys rotate: --batch-size must be at least 1 and --pause not negative")
    settings = invocation.settings()
    vault = _vault(settings)

    def progress(what: str) -> Callable[[RotationReport], None]:
        return lambda report: invocation.note(f"rotated {report.rotated} {what} so far")

    async def rotate(store: Store) -> tuple[RotationReport, RotationReport]:
        batches = {"batch_size": args.batch_size, "pause": args.pause}
        grants = await rotate_grants(store, vault, progress=progress("grants"), **batches)
        secrets = await rotate_webhook_secrets(store, vault, progress=progress("webhook secrets"), **batches)
        await store.audit.record(
            "keys_rotated",
            detail={
                "key_id": vault.primary_key_id,
                "rotated": grants.rotated,
                "changed_meanwhile": grants.changed_meanwhile,
                "unreadable": len(grants.unreadable),
                "webhook_secrets_rotated": secrets.rotated,
                "webhook_secrets_unreadable": len(secrets.unreadable),
            },
        )
        return grants, secrets

    grants, secrets = invocation.with_store(rotate)
    invocation.note(
        f"{grants.rotated} grants and {secrets.rotated} webhook secrets re-encrypted under the active key "
        f"{vault.primary_key_id}"
    )
    unreadable = [
        (what, report) for what, report in (("grants", grants), ("webhook secrets", secrets)) if not report.complete
    ]
    if unreadable:
        report = unreadable[0][1]
        raise CliError(
            "keys rotate: "
            + " and ".join(f"{len(r.unreadable)} {w}" for w, r in unreadable)
            + f" do not decrypt with the configured keys (first: {report.unreadable[0]})",
            "`acp-connector keys status` shows the key ids they need; add those keys to the ring and run again",
        )
    return 0


def run_retire(invocation: Invocation) -> int:
    from ..rotation import key_usage
    from ..store import display_url
    from ..vault import remove_from_key_file

    key_id: str = invocation.args.key_id
    settings = invocation.settings()
    vault = _vault(settings)
    if key_id == vault.primary_key_id:
        raise CliError(
            f"keys retire: {key_id} is the active key",
            "make another key active (first in the ring, or vault.primary_key_id) everywhere, then rotate",
        )

    async def retire(store: Store) -> str | None:
        used = (await key_usage(store, datetime.now(UTC))).get(key_id)
        # Run again for a key already retired (and gone from the ring), it only truncates SQLite's log once more.
        retired_before = used is None and key_id not in vault.ring and await _retired_before(store, key_id)
        if used is None and key_id not in vault.ring and not retired_before:
            raise CliError(
                f"keys retire: no key {key_id} in the ring or the database", "`acp-connector keys status` lists them"
            )
        if used is not None and used.in_use:
            return (
                f"{used.grants} grants, {used.webhook_secrets} webhook secrets and "
                f"{used.open_flows + used.open_verifications} sign-ins in progress are encrypted under it"
            )
        if not retired_before:
            await store.audit.record("key_retired", detail={"key_id": key_id})
        # SQLite's log may still hold page images written under the key (secure_delete zeroes the file's records).
        if await store.db.truncate_write_ahead_log() is False:
            invocation.note(
                f"SQLite's write-ahead log ({display_url(store.db.url)}-wal) was in use and may still hold records "
                f"written under {key_id}: run `acp-connector keys retire {key_id}` again when the connector is idle"
            )
        return None

    refusal = invocation.with_store(retire)
    if refusal is not None:
        raise CliError(
            f"keys retire: {key_id} is still in use: {refusal}",
            "run `acp-connector keys rotate` (sign-ins in progress end within minutes), then retire again",
        )
    key_file = settings.vault.key_file
    if key_file is not None and remove_from_key_file(key_file, key_id):
        invocation.note(f"{key_id} is retired and removed from {key_file}; restart the connector to drop it")
    elif key_id in vault.ring:
        invocation.note(f"{key_id} is retired: now remove it from CONNECTOR_VAULT__KEYS and restart the connector")
    else:
        invocation.note(f"{key_id} is retired (it is not in the ring)")
    return 0


async def _retired_before(store: Store, key_id: str) -> bool:
    return any(event.detail == {"key_id": key_id} for event in await store.audit.list(event="key_retired"))
