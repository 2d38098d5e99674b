"""`acp-connector providers ...`: the provider catalog as this deployment sees it, and as the providers answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .framework import EXIT_OK, EXIT_RUNTIME, Commands, Invocation

if TYPE_CHECKING:
    from ..config import Settings
    from ..providers import ProviderEntry
    from ..vault import Vault


def register(commands: Commands) -> None:
    providers = commands.group(
        "providers",
        help="the provider catalog (providers.toml)",
        description="Inspect the OAuth providers of the catalog (providers.catalog) and their credentials.",
    )
    listing = providers.command(
        "list",
        run_list,
        help="list providers and whether each is configured",
        description=(
            "One line per catalog entry: its name, the provider's sign-in host, the redirect URI to register\n"
            "with the provider (built from public_base_url), and whether it is configured. A provider is\n"
            "configured when CONNECTOR_PROVIDER_<NAME>_CLIENT_ID and _CLIENT_SECRET are set and its endpoints\n"
            "are known. --details adds, under each, what it needs (credentials, per-connection values and where\n"
            "each comes from, the documentation where the app is registered) and how it departs from plain\n"
            "OAuth 2.0 (its quirks). Makes no network request."
        ),
        examples=["acp-connector providers list", "acp-connector providers list --details"],
    )
    listing.add_argument("--details", action="store_true", help="what each entry needs and its quirks")
    check = providers.command(
        "check",
        run_check,
        help="read every configured provider's discovery document and keys, and say what is wrong",
        description=(
            "For each configured provider (or the ones named): fetch and check its discovery document (issuer,\n"
            "endpoints, https), its signing keys (OpenID providers), and say which endpoints, which client\n"
            "authentication method and why, and whether refresh tokens can be expected (offline_access and\n"
            "prompt=consent). Unconfigured providers are listed and skipped. Exit code 1 when a provider has a\n"
            "problem; warnings alone do not fail. Changes nothing.\n\n"
            "--offline checks every entry (configured or not) without any network request: the catalog's keys,\n"
            "endpoints, placeholders and per-connection values, and what each entry needs and does."
        ),
        examples=[
            "acp-connector providers check",
            "acp-connector providers check oidc",
            "acp-connector providers check --offline",
        ],
    )
    check.add_argument("names", nargs="*", metavar="NAME", help="only these providers (default: all)")
    check.add_argument("--offline", action="store_true", help="no network: check the catalog entries alone")


def run_list(invocation: Invocation) -> int:
    from ..providers import load_catalog

    settings = invocation.settings()
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    base = settings.public_base_url
    rows = [("NAME", "PROVIDER", "AUTHORIZATION HOST", "REDIRECT URI", "STATUS")]
    for entry in catalog.entries():
        if entry.is_credential:  # no redirect URI: the user types the key on the connector's page
            rows.append(
                (entry.name, entry.shown_name, entry.api_host or "-", "-", f"ready ({entry.kind}: typed by the user)")
            )
            continue
        if entry.configured:
            status = "configured"
        elif not entry.has_credentials:
            status = f"unconfigured: set {entry.client_id_env_var} and {entry.client_secret_env_var}"
        else:
            status = "unconfigured: no endpoints (set the discovery URL)"
        host = entry.provider_host or "-"
        rows.append((entry.name, entry.shown_name, host, f"{base}/callback/{entry.name}", status))
    invocation.table(rows)
    if invocation.args.details:
        from ..providers.describe import entry_facts

        for entry in catalog.entries():
            facts = entry_facts(entry)
            invocation.out(f"\n{entry.name} ({facts.shown_name})")
            for line in facts.needs + facts.quirks:
                invocation.out(f"  {line}")
    return 0


def run_check_offline(invocation: Invocation, entries: list[ProviderEntry]) -> int:
    """Each entry as the catalog gives it (loading it already checked keys, URLs and placeholders): no network."""
    from ..providers.describe import entry_facts

    failed = []
    for entry in entries:
        facts = entry_facts(entry)
        invocation.out(f"{entry.name} ({facts.shown_name}): {'PROBLEM' if facts.problems else 'ok'}")
        for kind, lines in (("", facts.needs + facts.quirks), ("warning: ", facts.warnings)):
            for line in lines:
                invocation.out(f"  {kind}{line}")
        for line in facts.problems:
            invocation.out(f"  problem: {line}")
        if facts.problems:
            failed.append(entry.name)
    if failed:
        invocation.out(f"{len(failed)} provider(s) with problems: {', '.join(failed)}")
        return EXIT_RUNTIME
    invocation.out(f"{len(entries)} provider(s) checked offline")
    return EXIT_OK


def _optional_vault(settings: Settings) -> Vault | None:
    """The configured vault (private_key_jwt signs with a key derived from it), or None when none is."""
    from ..vault import Vault, load_key_ring

    ring = load_key_ring(settings.vault.keys, settings.vault.key_file, settings.vault.primary_key_id)
    return Vault(ring) if ring is not None else None


def run_check(invocation: Invocation) -> int:
    import asyncio

    from ..factories import build_gateway
    from ..metrics import Metrics
    from ..oauth.check import ProviderReport, check_provider
    from ..providers import load_catalog

    settings = invocation.settings()
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    entries = [catalog.get(name) for name in invocation.args.names] if invocation.args.names else catalog.entries()
    if invocation.args.offline:
        return run_check_offline(invocation, entries)

    async def check_all() -> list[ProviderReport]:
        gateway = build_gateway(settings, catalog, Metrics(entry.name for entry in entries), _optional_vault(settings))
        try:
            return list(await asyncio.gather(*(check_provider(gateway, entry) for entry in entries)))
        finally:
            await gateway.aclose()

    failed = []
    for report in asyncio.run(check_all()):
        verdict = "ok" if report.ok else "PROBLEM"
        invocation.out(f"{report.name} ({report.shown_name}): {verdict if report.configured else 'skipped'}")
        for kind, lines in (("", report.facts), ("warning: ", report.warnings), ("problem: ", report.problems)):
            for line in lines:
                invocation.out(f"  {kind}{line}")
        if not report.ok:
            failed.append(report.name)
    if failed:
        invocation.out(f"{len(failed)} provider(s) with problems: {', '.join(failed)}")
        return EXIT_RUNTIME
    return EXIT_OK
