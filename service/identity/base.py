"""Identity verifiers as plugins: what a verifier owns, what it is given, and the rows it keeps.

A verifier plugin (`VerifierPlugin`) owns its name, its settings model (the `[identity.<name>]` section, also
`CONNECTOR_IDENTITY__<NAME>__*`), how it is built, and its routes: browser routes mounted under
`/identity/<name>` and API routes under `/v1/identity/<name>`. Plugins are found by name in
`service.identity.registry` (built-ins, the `acp_connector.verifiers` entry point group, or `register()`).

A verifier answers `begin` with `Verified` (it knows the browser's identity at once) or `RedirectFirst` (it sends
the browser away and finishes on its own route, calling `RouteKit.step.continue_after`). It never compares
identities itself: `service.core.browser.BrowserFlow.check_identity` does. It refuses with `FlowRefused` (a stable
code, an audit event); the web layer turns that into a page or a JSON error.

Verifier state that must survive a round trip is server-side (`store.verifications`): single-use, expiring,
bound to the browser-binding cookie, with handles stored only as hashes. Nothing the browser supplies
unauthenticated (URL, form field, header from an untrusted peer) is ever taken as identity.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic_settings import NoDecode

from service.config import Settings, optional_str, split_list
from service.core.errors import FlowRefused
from service.core.handles import binding_hash
from service.core.records import VerificationRecord
from service.core.settings import FlowSettings
from service.core.urls import url_problem
from service.core.verification import BrowserFacts, IdentityStep, VerificationAttempt, Verifier

if TYPE_CHECKING:  # annotations only: reading a verifier's settings (the CLI) needs none of the web or the store
    from starlette.requests import Request
    from starlette.responses import Response

    from service.oauth import ProviderGateway
    from service.store import Store
    from service.vault import Vault

# How long the browser may spend at the identity provider or the operator's app.
VERIFICATION_TTL = timedelta(minutes=10)


class VerifierSettings(BaseModel):
    """Base of a verifier's settings model: unknown keys are refused, each field's docstring is its description
    (docs/reference.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _checked_url(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if (problem := url_problem(value)) is not None:
        raise ValueError(problem)
    return value


# Field types of verifier settings. An empty or blank value is unset (TOML has no null).
EmptyIsNone = BeforeValidator(optional_str)
OptionalText = Annotated[str | None, EmptyIsNone]
OptionalUrl = Annotated[str | None, EmptyIsNone, AfterValidator(_checked_url)]  # https unless loopback
# A list; in the environment, comma-separated.
TextList = Annotated[list[str], NoDecode, BeforeValidator(split_list)]


@dataclass(frozen=True)
class VerifierContext:
    """What a verifier is built with."""

    settings: Settings  # the whole configuration (e.g. server.trusted_proxies, public_base_url)
    flow: FlowSettings
    store: Store
    vault: Vault
    providers: ProviderGateway  # the protocol to OpenID/OAuth providers (discovery, tokens, ID tokens), pooled
    clock: Callable[[], datetime]

    def now(self) -> datetime:
        return self.clock()


class RouteKit(Protocol):
    """What the web layer gives a verifier's routes: the identity step, the browser and HTTP answers."""

    @property
    def step(self) -> IdentityStep: ...

    def binding(self, request: Request) -> str | None:
        """The browser-binding cookie's value, if the browser carries a valid one."""
        ...

    def browser(self, request: Request) -> BrowserFacts: ...

    def redirect(self, url: str) -> Response:
        """Send the browser on (303)."""
        ...

    def json(self, body: dict[str, Any]) -> Response:
        """A successful JSON answer for an API route."""
        ...

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The request's JSON object body (small; FlowRefused `bad_request` otherwise)."""
        ...

    async def limit(self, request: Request, key: str) -> Response | None:
        """Count one request for `key` against the confirm rate limit: the 429 answer when over, else None."""
        ...

    def api_error(self, exc: FlowRefused, **extra: str) -> Response:
        """The JSON error answer for `exc`, with `extra` fields beside it."""
        ...


Endpoint = Callable[["Request"], Awaitable["Response"]]


@dataclass(frozen=True)
class VerifierRoute:
    """One route of a verifier: `path` relative to its prefix ("" is the prefix itself)."""

    path: str
    endpoint: Endpoint
    methods: tuple[str, ...] = ("GET",)


@dataclass(frozen=True)
class VerifierRoutes:
    """A verifier's routes: `browser` under `/identity/<name>`, `api` under `/v1/identity/<name>`."""

    browser: Sequence[VerifierRoute] = field(default_factory=tuple)
    api: Sequence[VerifierRoute] = field(default_factory=tuple)


class IdentityVerifier(Verifier, Protocol):
    """A built verifier: the core's `Verifier`, plus its routes and, for the local verifier, its one user."""

    def routes(self, kit: RouteKit) -> VerifierRoutes: ...


class VerifierPlugin(Protocol):
    """One kind of verifier, found by `name` in the registry."""

    @property
    def name(self) -> str: ...

    @property
    def settings_model(self) -> type[BaseModel]:
        """The model of the `[identity.<name>]` section (extra keys forbidden)."""
        ...

    def build(self, ctx: VerifierContext, settings: Any) -> IdentityVerifier:
        """The verifier; ConfigError naming the key when the settings do not allow it."""
        ...


class NoRoutes:
    """Mixin for verifiers that know the browser's identity at once and need no routes of their own."""

    def routes(self, kit: RouteKit) -> VerifierRoutes:
        return VerifierRoutes()

    async def form_targets(self) -> list[str]:
        return []


# -- server-side verification rows ---------------------------------------------------------------------------


async def insert_verification(
    ctx: VerifierContext,
    attempt: VerificationAttempt,
    *,
    verification_id: str,
    verifier: str,
    handle_hash: str,
    nonce: str | None = None,
    pkce_key_id: str | None = None,
    pkce_ciphertext: bytes | None = None,
) -> None:
    """Store the server-side row of a verification that sends the browser away, bound to its browser and expiry."""
    now = ctx.now()
    await ctx.store.verifications.insert(
        VerificationRecord(
            id=verification_id,
            elicitation_id=attempt.elicitation.id,
            verifier=verifier,
            handle_hash=handle_hash,
            return_hash=None,
            browser_binding_hash=binding_hash(attempt.browser_binding),
            nonce=nonce,
            pkce_key_id=pkce_key_id,
            pkce_ciphertext=pkce_ciphertext,
            outcome=None,
            identity=None,
            created_at=now,
            expires_at=min(attempt.elicitation.expires_at, now + VERIFICATION_TTL),
            confirmed_at=None,
            used_at=None,
            intent=attempt.intent,
        )
    )


def own_verification(
    record: VerificationRecord | None, verifier: str, *, code: str = "unknown_verification", step: str | None = None
) -> VerificationRecord:
    """The row a handle brought back, if `verifier` wrote it: a handle that found no row, or another verifier's
    row, is refused (FlowRefused `code`, audited as `unknown_verification`)."""
    if record is None or record.verifier != verifier:
        audit = {"identity_verifier": verifier} if step is None else {"identity_verifier": verifier, "step": step}
        raise FlowRefused(code, event="unknown_verification", audit=audit)
    return record


async def claim_for_browser(
    ctx: VerifierContext, record: VerificationRecord, browser_binding: str | None, *, verifier: str
) -> VerificationRecord:
    """Use a verification row once, from the browser that started it. Raises FlowRefused otherwise.

    A row brought back by another browser is not consumed: the rightful browser can still finish.
    """
    if browser_binding is None or binding_hash(browser_binding) != record.browser_binding_hash:
        raise FlowRefused(
            "browser_mismatch",
            event="browser_mismatch",
            elicitation_id=record.elicitation_id,
            audit={"identity_verifier": verifier, "step": "identity"},
        )
    claimed = await ctx.store.verifications.claim(record.id, ctx.now())
    if claimed is not None:
        return claimed
    record = await ctx.store.verifications.get_by_handle(record.handle_hash) or record  # what beat us to it
    if record.used_at is not None or (record.verifier == "confirm" and record.confirmed_at is None):
        raise FlowRefused(
            "verification_used",
            event="replay_attempt" if record.used_at is not None else "verification_unconfirmed",
            elicitation_id=record.elicitation_id,
            audit={"identity_verifier": verifier, "step": "identity"},
        )
    raise FlowRefused(
        "verification_expired",
        event="verification_expired",
        elicitation_id=record.elicitation_id,
        audit={"identity_verifier": verifier},
    )
