"""Credential entries at the provider: injecting typed values into requests, and the check request that proves
them before anything is stored.

Values go only into requests for the entry's own API base (`CredentialInjector` refuses any other destination),
and never into an exception message, a log line or a metric label: a refusal is told by the provider's error code
(read at the entry's `check.error` pointer, kept only when it is a short word) or its HTTP status.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Mapping

import httpx

from service.core.credentials import CredentialForm, CredentialVerdict, FieldView
from service.core.errors import ConnectorError, ProviderError
from service.core.urls import host_of
from service.providers import ProviderEntry
from service.providers.credentials import CredentialSpec, account_from, fill_values, injected
from service.providers.quirks import resolve_pointer

from .resolved import ResolvedProvider

_ERROR_WORD = re.compile(r"^[A-Za-z0-9_. -]{1,64}$")


def spec_of(entry: ProviderEntry) -> CredentialSpec:
    if entry.credential is None:
        raise ConnectorError(f"{entry.shown_name} is not a credential entry", code="provider_misconfigured")
    return entry.credential


def form_of(entry: ProviderEntry) -> CredentialForm | None:
    """What the credential page shows for `entry` (None for an OAuth entry)."""
    if entry.credential is None:
        return None
    fields = tuple(
        FieldView(name, spec.label, spec.help, spec.docs_url) for name, spec in entry.credential.fields.items()
    )
    return CredentialForm(
        provider=entry.shown_name,
        kind=entry.credential.kind,
        fields=fields,
        api_host=entry.api_host or "",
        revoke_url=entry.credential.revoke_url,
    )


def secret_parameters(entry: ProviderEntry) -> frozenset[str]:
    """The query parameters a credential entry injects its values as (none for an OAuth entry)."""
    if entry.credential is None:
        return frozenset()
    return frozenset(i.parameter for i in entry.credential.inject if i.style == "query" and i.parameter)


def inject(request: httpx.Request, spec: CredentialSpec, values: Mapping[str, str]) -> None:
    """Write every injection of `spec` into `request` (headers replaced, a query parameter set)."""
    for injection in spec.inject:
        target, value = injected(injection, values)
        if target.startswith("?"):
            request.url = request.url.copy_set_param(target[1:], value)
        else:
            request.headers[target] = value


class CredentialInjector(httpx.Auth):
    """httpx auth that injects fixed credential values, only into requests for the API base's origin."""

    def __init__(self, provider: ResolvedProvider, values: Mapping[str, str]) -> None:
        self._spec = spec_of(provider.entry)
        self._values = dict(values)
        self._provider = provider
        self._origin = httpx.URL(provider.api_base_url or "")

    def __repr__(self) -> str:
        return f"CredentialInjector({self._provider.name!r})"

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        check_destination(request.url, self._origin, self._provider.display_name)
        inject(request, self._spec, self._values)
        yield request


def check_destination(url: httpx.URL, origin: httpx.URL, display_name: str) -> None:
    if (url.scheme, url.host, url.port) != (origin.scheme, origin.host, origin.port):
        raise ConnectorError(
            f"refusing to send {display_name} credentials to {url.scheme}://{url.host}: "
            f"only {origin.scheme}://{origin.host} receives them",
            code="credential_host_not_allowed",
        )


def _refusal_code(response: httpx.Response, pointer: str | None) -> str:
    """The provider's refusal as a short word (its error code at `pointer`), else its HTTP status."""
    if pointer is not None:
        try:
            found = resolve_pointer(response.json(), pointer)
        except ValueError:
            found = None
        if isinstance(found, str | int) and not isinstance(found, bool) and _ERROR_WORD.fullmatch(str(found)):
            return str(found)
    return f"HTTP {response.status_code}"


def _noun(spec: CredentialSpec) -> str:
    return "these credentials" if len(spec.fields) > 1 else "this key"


async def check(provider: ResolvedProvider, client: httpx.AsyncClient, values: Mapping[str, str]) -> CredentialVerdict:
    """Send the entry's check request with `values` injected; read the account it names or its refusal.

    ProviderError `provider_timeout` when no answer came within the check's time, `provider_unavailable` when the
    provider could not be reached or answered otherwise (a 5xx, a 429)."""
    spec = spec_of(provider.entry)
    if spec.check is None:
        return CredentialVerdict()
    check_request = spec.check
    base = (provider.api_base_url or "").rstrip("/")
    url = httpx.URL(base + fill_values(check_request.path, {k: _path_safe(v) for k, v in values.items()}))
    if host_of(str(url)) != provider.entry.api_host:
        raise ProviderError(f"{provider.display_name} check request leaves the API host", code="provider_misconfigured")
    headers = {"accept": "application/json"}
    content = None
    if check_request.body is not None:
        headers["content-type"] = "application/json"
        content = check_request.body.encode()
    request = client.build_request(check_request.method, url, headers=headers, content=content)
    request.extensions["timeout"] = httpx.Timeout(check_request.timeout_seconds).as_dict()
    inject(request, spec, values)
    try:
        response = await client.send(request)
        await response.aread()
    except httpx.TimeoutException:
        raise ProviderError(
            f"{provider.display_name} did not answer the check in time", code="provider_timeout"
        ) from None
    except httpx.HTTPError as exc:
        raise ProviderError(
            f"{provider.display_name} could not be reached for the check ({type(exc).__name__})",
            code="provider_unavailable",
        ) from None
    if response.status_code in check_request.expect:
        try:
            document = response.json() if check_request.account else None
        except ValueError:
            document = None
        return CredentialVerdict(account_id=account_from(document, check_request.account))
    if response.status_code in check_request.refused:
        code = _refusal_code(response, check_request.error)
        return CredentialVerdict(refusal=f"{provider.display_name} refused {_noun(spec)}: {code}.")
    raise ProviderError(
        f"{provider.display_name} answered the check with HTTP {response.status_code}", code="provider_unavailable"
    )


def _path_safe(value: str) -> str:
    """A value as one path segment: anything but letters, digits and -._~ percent-encoded."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-._~") else f"%{ord(c):02X}" for c in value)
