"""Checking a configured provider the way a connect would use it: its discovery document, its signing keys, the
client authentication method (and why), and whether refresh tokens can be expected.

`acp-connector providers check` prints these reports; the service logs them at startup (discovery only) and keeps
running whatever they say.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from service.core.errors import ConnectorError, DiscoveryError
from service.core.records import OFFLINE_ACCESS
from service.providers import ProviderEntry

from .authorize import prompt_for
from .client_keys import ALGORITHM, JWKS_PATH
from .dpop import ALGORITHM as DPOP_ALGORITHM
from .gateway import ProviderGateway
from .resolved import ResolvedProvider

log = logging.getLogger("service.oauth.check")


@dataclass
class ProviderReport:
    """What a check found: `facts` say what will be used, `problems` what stops a connect, `warnings` the rest."""

    name: str
    shown_name: str
    configured: bool
    facts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    field_at_fault: str | None = None  # the discovery document's member at fault, when one is

    @property
    def ok(self) -> bool:
        return not self.problems


async def check_provider(gateway: ProviderGateway, entry: ProviderEntry, *, keys: bool = True) -> ProviderReport:
    """Check one catalog entry: read its discovery document afresh, and with `keys` its JWKS."""
    report = ProviderReport(entry.name, entry.shown_name, entry.configured)
    if not entry.configured:
        missing = "client credentials" if not entry.has_credentials else "endpoints (a discovery URL)"
        report.facts.append(f"not configured: no {missing}; skipped")
        return report
    if entry.credential is not None:
        check = entry.credential.check
        report.facts.append(f"{entry.kind}: sent only to {entry.api_base_url}")
        report.facts.append(
            f"check request: {check.method} {check.path}, run when a user enters the credential"
            if check is not None
            else "no check request: a credential is stored once its format passes"
        )
        return report
    try:
        provider = await gateway.rediscover(entry)
    except DiscoveryError as exc:
        report.problems.append(str(exc))
        report.field_at_fault = exc.field
        return report
    except ConnectorError as exc:
        report.problems.append(str(exc))
        return report
    report.shown_name = provider.display_name
    _describe(provider, report)
    if keys and provider.oidc and provider.jwks_uri is not None:
        try:
            key_set = await gateway.jwks.get(provider.jwks_uri, gateway.http_client(provider), refresh=True)
        except ConnectorError as exc:
            report.problems.append(str(exc))
        else:
            report.facts.append(f"signing keys: {len(key_set.keys)} at {provider.jwks_uri}")
    return report


def _describe(provider: ResolvedProvider, report: ProviderReport) -> None:
    if provider.discovered:
        report.facts.append(f"discovery: {provider.discovery_url} (issuer {provider.issuer})")
    report.facts.append(f"authorization endpoint: {provider.authorization_endpoint}")
    report.facts.append(f"token endpoint: {provider.token_endpoint}")
    report.facts.append(f"revocation endpoint: {provider.revocation_endpoint or 'none (disconnect only deletes)'}")
    report.facts.append(f"client authentication: {provider.token_endpoint_auth_method} ({provider.auth_method_reason})")
    supported = provider.extra.get("token_endpoint_auth_methods_supported")
    if (
        isinstance(supported, tuple)
        and provider.entry.token_endpoint_auth_method is not None
        and provider.token_endpoint_auth_method not in supported
    ):
        report.warnings.append(
            f"token_endpoint_auth_method {provider.token_endpoint_auth_method} is not among the methods the "
            f"provider lists ({', '.join(supported)})"
        )
    if provider.entry.fapi2:
        report.facts.append(
            "FAPI 2.0 profile: PAR, PKCE S256, private_key_jwt, DPoP and the iss parameter, all offered by the provider"
        )
    if provider.entry.resource:
        asked = provider.entry.userinfo if provider.entry.userinfo is not None else False
        report.facts.append(
            f"resource indicators: {', '.join(provider.entry.resource)} (RFC 8707, on the authorization and token "
            f"requests); the account is the ID token's sub{', userinfo asked too' if asked else ', userinfo not asked'}"
        )
    _describe_par(provider, report)
    _describe_dpop(provider, report)
    if provider.token_endpoint_auth_method == "private_key_jwt":  # noqa: S105 (a method name)
        _describe_client_key(provider, report)
    if not provider.api_base_url:
        report.warnings.append("no api_base_url: connector.http() cannot be used with this provider")
    scopes = provider.default_scopes
    if provider.oidc and OFFLINE_ACCESS in scopes:
        prompt = prompt_for(provider, scopes) or provider.extra_authorize_params.get("prompt", "")
        if "consent" in prompt.split():
            report.facts.append("refresh tokens: offline_access is asked with prompt=consent")
        else:
            report.warnings.append(
                f"offline_access is asked with prompt={prompt!r}, without consent: a conformant provider drops it "
                "and issues no refresh token, so each grant will need the user again when its token expires"
            )


def _describe_par(provider: ResolvedProvider, report: ProviderReport) -> None:
    """Pushed authorization requests (RFC 9126): used or not, and why."""
    reason = provider.par_reason
    if reason is None:
        offered = f"offered at {provider.par_endpoint}" if provider.par_endpoint else "not offered"
        report.facts.append(f"pushed authorization requests: not used ({offered}, not required)")
    elif provider.par_endpoint is None:
        report.problems.append(f"pushed authorization requests: {reason}, but the provider has no endpoint for them")
    else:
        report.facts.append(f"pushed authorization requests: used, {reason} ({provider.par_endpoint})")


def _describe_dpop(provider: ResolvedProvider, report: ProviderReport) -> None:
    """DPoP (RFC 9449): used where the entry asks for it; a provider that only advertises it issues Bearer tokens."""
    listed = provider.extra.get("dpop_signing_alg_values_supported")
    algorithms = tuple(str(a) for a in listed) if isinstance(listed, tuple) else None
    offered = bool(algorithms)
    if not provider.entry.dpop:
        advertised = f"the provider advertises it ({', '.join(algorithms or ())})" if offered else "not advertised"
        report.facts.append(f"DPoP: not used ({advertised}; the entry does not ask for it: Bearer tokens)")
    elif algorithms is not None and DPOP_ALGORITHM not in algorithms:
        report.problems.append(
            f"DPoP: the entry asks for it, but the provider does not list {DPOP_ALGORITHM} in "
            f"dpop_signing_alg_values_supported ({', '.join(algorithms) or 'none'})"
        )
    else:
        report.facts.append(
            f"DPoP: used, the entry asks for it ({DPOP_ALGORITHM}, a key per grant; "
            f"{'the provider lists ' + DPOP_ALGORITHM if offered else 'the provider does not advertise DPoP'})"
        )


def _describe_client_key(provider: ResolvedProvider, report: ProviderReport) -> None:
    """private_key_jwt: which key signs, where the provider finds its public half, and whether it takes ES256."""
    if provider.client_keys is None:
        report.problems.append("private_key_jwt needs the connector's signing key: configure the vault (vault.keys)")
        return
    audience = provider.entry.client_assertion_audience
    report.facts.append(
        f"client key: {ALGORITHM} key {provider.client_keys.active_kid} from the vault, assertions addressed to the "
        f"{'token endpoint' if audience == 'token_endpoint' else 'issuer'}; public keys at {JWKS_PATH} of the "
        "connector, or printed by `acp-connector keys jwks`"
    )
    algorithms = provider.extra.get("token_endpoint_auth_signing_alg_values_supported")
    if isinstance(algorithms, tuple) and ALGORITHM not in algorithms:
        report.problems.append(
            f"the provider does not list {ALGORITHM} in token_endpoint_auth_signing_alg_values_supported "
            f"({', '.join(algorithms)}): it would refuse our client assertions"
        )


async def log_provider_problems(gateway: ProviderGateway) -> list[ProviderReport]:
    """Check every configured provider's discovery document (not its keys) and log what is wrong, one warning
    per problem naming the provider and the field. For startup: nothing stops, a connect will try again."""
    entries = [entry for entry in gateway.catalog.entries() if entry.configured]
    results = await asyncio.gather(
        *(check_provider(gateway, entry, keys=False) for entry in entries), return_exceptions=True
    )
    reports = []
    for entry, report in zip(entries, results, strict=True):
        if isinstance(report, BaseException):
            if not isinstance(report, Exception):
                raise report
            log.error("provider %r could not be checked", entry.name, exc_info=report)
            continue
        reports.append(report)
        for problem in report.problems:
            log.warning(
                "provider %r: %s",
                report.name,
                problem,
                extra={"provider": report.name, "field": report.field_at_fault or "-"},
            )
        for warning in report.warnings:
            log.warning("provider %r: %s", report.name, warning, extra={"provider": report.name})
    return reports
