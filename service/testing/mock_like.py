"""A mock provider that behaves like one catalog entry: `EmulatedProvider.like("slack")`.

Built from the same published facts as the entry (config/providers.toml): the real URLs are moved onto the mock
(`https://slack.com/api/oauth.v2.user.access` is served at `{base}/slack.com/api/oauth.v2.user.access`), and the mock
insists on everything the entry says: the token request's encoding, client authentication method and extra
parameters, PKCE on or off, the scope separator, the authorization's extra parameters; it answers tokens where the
entry says (Slack's `authed_user`), expiry in the entry's form, errors with 200 where the provider does, hands out
the per-connection values of the token response (an instance URL on the mock) and the callback (a company id),
checks the agent's values in its paths (a tenant, a shop's subdomain), takes API calls in the entry's header, and
revokes as the entry says (GitHub's `DELETE` with Basic auth and a JSON body, a bearer call). Its
`catalog_entry()` is the entry's table with the URLs moved onto the mock. `acp-connector mock-provider --like NAME`
serves one.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlencode

from service.providers import ENDPOINT_FIELDS, ProviderEntry
from service.providers.loading import build_entry
from service.providers.quirks import fill

from .mock_http import MockRequest, MockResponse, first_values
from .mock_legacy import TOKEN_EXCHANGE, LegacyTokens
from .mock_oidc import MockOIDCProvider
from .mock_provider import MockOAuthProvider
from .mock_shapes import Route, account_document, mock_url, path_pattern, shaped_error, shaped_token_answer

if TYPE_CHECKING:
    import respx

CATALOG = Path(__file__).resolve().parents[2] / "config" / "providers.toml"
TENANT_ID = "9188040d-6c67-4c5b-b112-36a304b66dad"  # the tenant the emulated ID tokens name ({tenantid})


def catalog_table(name: str, catalog: Path = CATALOG) -> dict[str, Any]:
    """The providers.toml table `name` as written."""
    import tomllib

    with catalog.open("rb") as handle:
        tables = tomllib.load(handle)
    if name not in tables:
        raise KeyError(f"no [{name}] in {catalog} (known: {', '.join(sorted(tables))})")
    return dict(tables[name])


@dataclass
class EmulatedProvider(MockOIDCProvider):
    """A mock of the catalog entry `name` (its table in `table`); see the module's doc."""

    name: str = "github"
    table: dict[str, Any] = field(default_factory=dict)
    account_id: str = "4242"
    seen_values: dict[str, str] = field(default_factory=dict)  # per-connection values the agent's URLs carried
    # The next successful token answer is passed through this first (to spoil it: drop the token, ...).
    spoil_next_token_answer: Any = None
    omit_callback_values: bool = False  # the next callback lacks the values it should carry (QuickBooks' realmId)
    token_statuses: list[int] = field(default_factory=list)  # the HTTP status of each token answer

    @classmethod
    def like(cls, name: str, catalog: Path = CATALOG, **fields: Any) -> Self:
        """A mock of catalog entry `name` of `catalog`; `fields` set MockOAuthProvider fields."""
        table = catalog_table(name, catalog)
        entry = build_entry(name, table, {}, str(catalog), {})
        refresh = entry.quirks.token_request.refresh_tokens
        settings: dict[str, Any] = {
            "base_url": f"https://{name}.mock-provider.test",
            "require_pkce": entry.pkce,
            "comma_scopes": False,
            "issue_refresh_token": refresh != "none",
            "rotate_refresh_tokens": refresh == "rotating",
            "iss_in_authorization_response": entry.authorization_response_iss_parameter_supported,
            "account": {"sub": "user-4242", "name": "Mona", "email": "mona@example.com"},
        }
        if entry.quirks.token_response.expires_form == "never":
            settings["expires_in"] = None
        legacy = entry.quirks.token_request.legacy_exchange
        if legacy is not None:  # its legacy tokens are migrated as the entry says
            settings["legacy"] = LegacyTokens(
                legacy.subject_token_type, legacy.requested_token_type, dict(legacy.params)
            )
        return cls(name=name, table=table, **{**settings, **fields})

    @functools.cached_property
    def entry(self) -> ProviderEntry:
        """The catalog entry this mock emulates (its quirks)."""
        return build_entry(self.name, self.table, {}, "<emulated>", {})

    @property
    def discovered(self) -> bool:
        """The entry names no endpoints (the generic OpenID entry): the plain mock with discovery stands in."""
        return not self.table.get("authorization_endpoint")

    # -- the catalog table ----------------------------------------------------------------------------
    def catalog_entry(self) -> dict[str, Any]:
        """The entry's table with its URLs (and URL-valued patterns) moved onto this mock."""
        if self.discovered:
            return {**self.table, **self.discovery_entry(), "api_base_url": f"{self.base_url}/api"}
        table = dict(self.table)
        for key in ENDPOINT_FIELDS:
            if table.get(key):
                table[key] = mock_url(self.base_url, table[key])
        connection = {name: dict(value) for name, value in table.get("connection", {}).items()}
        for value in connection.values():
            if str(value.get("example", "")).startswith("https://"):
                value["pattern"] = "^" + re.escape(self.base_url) + "/[A-Za-z0-9.-]+$"
        if connection:
            table["connection"] = connection
        return table

    @property
    def issuer(self) -> str:
        written = self.table.get("issuer")
        if self.discovered or not written:
            return self.issuer_override or self.base_url
        return fill(mock_url(self.base_url, written), {**self.seen_values, "tenantid": TENANT_ID})

    def emitted(self, name: str) -> str:
        """The value this mock hands out for a per-connection value of the callback or token response."""
        value = self.entry.quirks.value(name)
        example = value.example if value is not None and value.example else f"mock-{name}"
        return mock_url(self.base_url, example) if example.startswith("https://") else example

    # -- routing -----------------------------------------------------------------------------------------
    def install(self, router: respx.MockRouter) -> None:
        """Route every request to `base_url` through `router` (the emulated paths carry placeholders)."""
        router.route(url__startswith=self.base_url).mock(side_effect=self._respx)

    def _relative(self, url: str) -> str:
        absolute = fill(mock_url(self.base_url, url), self._emitted_urls())
        return absolute[len(self.base_url) :] if absolute.startswith(self.base_url) else absolute

    def _emitted_urls(self) -> dict[str, str]:
        values = {v.name: self.emitted(v.name) for v in self.entry.quirks.connection if v.source != "agent"}
        return {**values, "client_id": self.client_id}

    def emulated_routes(self) -> list[Route]:
        entry = self.entry
        wanted: list[tuple[str, str | None, str | None, bool]] = [
            ("authorize", "GET", entry.authorization_endpoint, False),
            ("token", "POST", entry.token_endpoint, False),
            ("userinfo", entry.quirks.userinfo_method, entry.userinfo_endpoint, False),
            ("revoke", entry.quirks.revocation.method, entry.revocation_endpoint, False),
            ("jwks", "GET", entry.jwks_uri, False),
            ("api", None, entry.api_base_url, True),
        ]
        return [
            Route(kind, method, path_pattern(self._relative(url), prefix=prefix))
            for kind, method, url, prefix in wanted
            if url
        ]

    def handle(self, request: MockRequest) -> MockResponse:
        if self.discovered:
            return super().handle(request)
        for route in self.emulated_routes():
            match = route.pattern.fullmatch(request.path)
            if match is None or (route.method is not None and route.method != request.method.upper()):
                continue
            problem = self._check_values(match.groupdict())
            if problem is not None:
                return MockResponse.json(400, {"error": "invalid_request", "error_description": problem})
            endpoint: Callable[[MockRequest], MockResponse] = getattr(self, f"_emulated_{route.kind}")
            return endpoint(request)
        return MockResponse.json(404, {"error": "not_found"})

    def _check_values(self, captured: dict[str, str]) -> str | None:
        """The agent's values in a path must fit the entry, and be the ones the authorization used."""
        for name, text in captured.items():
            value = self.entry.quirks.value(name)
            if value is not None and value.problem(text) is not None:
                return f"{name} {text!r} is not a valid {name}"
            if self.seen_values.setdefault(name, text) != text:
                return f"{name} {text!r} is not the {name} this grant was made for"
        return None

    # -- endpoints -------------------------------------------------------------------------------------
    def _emulated_authorize(self, request: MockRequest) -> MockResponse:
        entry, query = self.entry, dict(request.query)
        redirect = query.get("redirect_uri", "")
        refusal = self._authorize_refusal(entry, query)
        if refusal is not None:
            return MockResponse.redirect(redirect, error="invalid_request", error_description=refusal)
        query["scope"] = " ".join(query.pop(entry.quirks.scope_parameter, "").split(entry.scope_separator))
        answer = self._authorize(MockRequest("GET", "/authorize", query, request.headers))
        location = answer.headers.get("location")
        values = {v.parameter: self.emitted(v.name) for v in entry.quirks.values_from("callback") if v.parameter}
        if self.omit_callback_values:
            values, self.omit_callback_values = {}, False
        if location is not None and values and "code=" in location:
            answer = MockResponse(answer.status, {"location": f"{location}&{urlencode(values)}"})
        return answer

    def _authorize_refusal(self, entry: ProviderEntry, query: dict[str, str]) -> str | None:
        for key, value in entry.extra_authorize_params.items():
            if query.get(key) != value:
                return f"{key}={value} is required"
        if not entry.pkce and "code_challenge" in query:
            return "PKCE is not supported"
        if entry.quirks.scope_parameter != "scope" and "scope" in query:
            return f"scopes go in {entry.quirks.scope_parameter}, not scope"
        other = " " if entry.scope_separator != " " else ","
        if other in query.get(entry.quirks.scope_parameter, ""):
            return f"scopes are separated by {entry.scope_separator!r}"
        return None

    def _token_form(self, entry: ProviderEntry, request: MockRequest) -> dict[str, str] | str:
        """The token request's parameters, or why they are refused (encoding, extra parameters); a legacy token's
        exchange is encoded as the entry's `legacy_token_exchange` says, its parameters checked by `mock_legacy`."""
        is_json = request.header("content-type").startswith("application/json")
        form = request.params()
        grant_type = form.get("grant_type")
        extra = entry.quirks.token_request
        encoding = extra.encoding
        if grant_type == TOKEN_EXCHANGE and extra.legacy_exchange is not None:
            encoding = extra.legacy_exchange.encoding
        if is_json != (encoding == "json"):
            return f"the token request must be {encoding}-encoded"
        if grant_type == TOKEN_EXCHANGE:
            return form
        wanted = extra.exchange_params if grant_type == "authorization_code" else extra.refresh_params
        for key, value in wanted.items():
            if form.get(key) != value:
                return f"{key}={value} is required"
        return form

    def _emulated_token(self, request: MockRequest) -> MockResponse:
        answer = self._token_answer(request)
        self.token_statuses.append(answer.status)
        return answer

    def _token_answer(self, request: MockRequest) -> MockResponse:
        entry = self.entry
        form = self._token_form(entry, request)
        if isinstance(form, str):
            status, body = shaped_error(entry, "invalid_request", 400)
            return MockResponse.json(status, body)
        method = self._client_auth(request, form)
        if method is not None and entry.token_endpoint_auth_method not in (None, method):
            return MockResponse.json(401, {"error": "invalid_client", "error_description": f"{method} is refused"})
        headers = {**request.headers, "content-type": "application/x-www-form-urlencoded"}
        plain = MockRequest("POST", "/token", {}, headers, urlencode(form).encode())
        answer = (MockOIDCProvider._token if entry.oidc else MockOAuthProvider._token)(self, plain)
        if answer.headers.get("content-type") != "application/json":
            return answer  # an outage's page (`token_outages`), passed on as it is
        body = json.loads(answer.body)
        if answer.status != 200:
            return self._token_error(entry, form.get("grant_type", ""), str(body.get("error")), answer.status)
        values = {v.name: self.emitted(v.name) for v in entry.quirks.values_from("token_response")}
        shaped = shaped_token_answer(entry, body, values=values, account_id=self.account_id)
        if self.spoil_next_token_answer is not None:
            spoil, self.spoil_next_token_answer = self.spoil_next_token_answer, None
            shaped = spoil(shaped)
        return MockResponse.json(200, shaped)

    def _token_error(self, entry: ProviderEntry, grant_type: str, error: str, status: int) -> MockResponse:
        """A refused token request in the provider's words (GitHub: bad_verification_code, with 200)."""
        shape = entry.quirks.token_response
        if error == "invalid_grant" and grant_type == "authorization_code":
            error = next((e for e in shape.errors_with_200 if "code" in e), error)
        elif error == "invalid_grant" and grant_type == "refresh_token":
            dead = shape.dead_refresh_token_errors  # the provider's own form first (GitHub's, with HTTP 200)
            error = next((e for e in dead if e in shape.errors_with_200), dead[0] if dead else error)
        status, body = shaped_error(entry, error, status)
        return MockResponse.json(status, body)

    def _token_of(self, request: MockRequest) -> str | None:
        """The access token an API call carries in the entry's header, if this mock issued it and it is live."""
        auth = self.entry.quirks.api_auth
        header = request.header(auth.header)
        if not header.startswith(auth.prefix) or not self.api_accepts(header[len(auth.prefix) :]):
            return None
        return header[len(auth.prefix) :]

    def _emulated_userinfo(self, request: MockRequest) -> MockResponse:
        self.api_calls.append(request.path)
        if self._token_of(request) is None:
            return MockResponse.json(401, {"error": "invalid_token"})
        wanted = self.entry.quirks.userinfo_body
        if wanted is not None and request.body.decode() != wanted:
            return MockResponse.json(400, {"error": "invalid_request", "error_description": "unexpected body"})
        account_id = str(self.account["sub"]) if self.entry.oidc else self.account_id
        return MockResponse.json(200, account_document(self.entry, self.account, account_id))

    def _emulated_api(self, request: MockRequest) -> MockResponse:
        self.api_calls.append(request.path)
        if self._token_of(request) is None:
            return MockResponse.json(401, {"error": "invalid_token"})
        return MockResponse.json(200, {"ok": True, "method": request.method, "path": request.path})

    def _emulated_jwks(self, request: MockRequest) -> MockResponse:
        return self._jwks(request)

    def _emulated_revoke(self, request: MockRequest) -> MockResponse:
        entry = self.entry
        style = entry.quirks.revocation
        is_json = request.header("content-type").startswith("application/json")
        body = json.loads(request.body) if is_json and request.body else first_values(request.body.decode())
        if request.body and is_json != (style.encoding == "json"):
            return MockResponse.json(400, {"error": "invalid_request"})
        missing = [name for name, value in style.headers.items() if request.header(name) != value]
        if missing:  # Notion answers 400 to a revocation without its Notion-Version header
            return MockResponse.json(
                400, {"error": "invalid_request", "error_description": f"{missing[0]} is required"}
            )
        token = self._token_of(request) if style.auth == "bearer" else None
        if style.auth == "bearer":
            authorized = token is not None
        else:
            method = self._client_auth(request, body)
            wanted = "client_secret_basic" if style.auth == "basic" else entry.token_endpoint_auth_method
            authorized = method is not None and wanted in (None, method)
        self.revocation_requests.append(
            {
                "token_type_hint": str(body.get("token_type_hint", "")),
                "client_auth": style.auth if authorized else "failed",
            }
        )
        if not authorized:
            return MockResponse.json(401, {"error": "invalid_client"})
        grant = self._grants.get(str(body.get(style.token_param, "")) if style.token_param else token or "")
        if grant is not None:  # every token of the grant goes with it
            self._access -= grant.tokens
            self._refresh -= grant.tokens
        return MockResponse(204) if style.method == "DELETE" else MockResponse.json(200, {"ok": True})

    def make_id_token(
        self, *, nonce: str | None, subject: str | None = None, account: dict[str, Any] | None = None
    ) -> str:
        if "{tenantid}" in str(self.table.get("issuer", "")):
            self.id_token_claims.setdefault("tid", TENANT_ID)
        return super().make_id_token(nonce=nonce, subject=subject, account=account)


__all__ = ["CATALOG", "EmulatedProvider", "catalog_table"]
