"""`acp-connector providers ...`: the provider catalog as this deployment sees it."""

from __future__ import annotations

from ..providers import load_catalog
from .framework import Commands, Invocation


def register(commands: Commands) -> None:
    providers = commands.group(
        "providers",
        help="the provider catalog (providers.toml)",
        description="Inspect the OAuth providers of the catalog (providers.catalog) and their credentials.",
    )
    providers.command(
        "list",
        run_list,
        help="list providers and whether each is configured",
        description=(
            "One line per catalog entry: its name, the provider's sign-in host, the redirect URI to register\n"
            "with the provider (built from public_base_url), and whether it is configured. A provider is\n"
            "configured when CONNECTOR_PROVIDER_<NAME>_CLIENT_ID and _CLIENT_SECRET are set and its endpoints\n"
            "are known. Makes no network request."
        ),
        examples=["acp-connector providers list"],
    )


def run_list(invocation: Invocation) -> int:
    settings = invocation.settings()
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    base = settings.public_base_url
    rows = [("NAME", "PROVIDER", "AUTHORIZATION HOST", "REDIRECT URI", "STATUS")]
    for entry in catalog.entries():
        if entry.configured:
            status = "configured"
        elif not entry.has_credentials:
            status = f"unconfigured: set {entry.client_id_env_var} and {entry.client_secret_env_var}"
        else:
            status = "unconfigured: no endpoints (set the discovery URL)"
        host = entry.provider_host or "-"
        rows.append((entry.name, entry.shown_name, host, f"{base}/callback/{entry.name}", status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        invocation.out("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0
