"""Identity verifiers are plugins: a toy verifier defined here, added through the registry alone, runs end to end.

The toy sends the browser to a route of its own first (`/identity/toy/sign-in`), keeps its state in the
server-side verification rows every redirecting verifier uses, and names the user from its settings section
(`CONNECTOR_IDENTITY__TOY__SUBJECT`). Nothing else in the connector knows it exists: the routes are mounted, the
settings validated and the identity compared by the same code that serves the built-in verifiers.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import Response

from service import ElicitationStatus, Identity
from service.core.errors import ConfigError, FlowRefused
from service.core.handles import handle_hash, new_id
from service.core.verification import RedirectFirst, Returned, VerificationAttempt
from service.identity import (
    RouteKit,
    VerifierContext,
    VerifierRoute,
    VerifierRoutes,
    register,
    unregister,
)
from service.identity.base import claim_for_browser, insert_verification
from service.testing import ScriptedBrowser

from .conftest import ALICE, Deploy
from .identity_support import events, started


class ToySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: str  # whom the toy says is in the browser, under ALICE's issuer


class ToyVerifier:
    name = "toy"

    def __init__(self, ctx: VerifierContext, settings: ToySettings) -> None:
        self.ctx = ctx
        self.identity = Identity(ALICE.issuer, settings.subject)

    async def begin(self, attempt: VerificationAttempt) -> RedirectFirst:
        handle, verification_id = new_id(), new_id(16)
        await insert_verification(
            self.ctx,
            attempt,
            verification_id=verification_id,
            verifier=self.name,
            handle_hash=handle_hash("toy", handle),
        )
        url = f"{self.ctx.flow.public_base_url}/identity/toy/sign-in?{urlencode({'handle': handle})}"
        return RedirectFirst(url, verification_id)

    async def form_targets(self) -> list[str]:
        return []  # its sign-in page is on the connector's own origin

    def routes(self, kit: RouteKit) -> VerifierRoutes:
        async def sign_in(request: Request) -> Response:
            binding = kit.binding(request)
            async with kit.step.refusals():
                record = await self.ctx.store.verifications.get_by_handle(
                    handle_hash("toy", request.query_params.get("handle", ""))
                )
                if record is None:
                    raise FlowRefused("unknown_verification", event="unknown_verification")
                record = await claim_for_browser(self.ctx, record, binding, verifier=self.name)
            assert binding is not None
            back = Returned(record.elicitation_id, self.identity, record.id)
            return kit.redirect(await kit.step.continue_after(back, binding))

        return VerifierRoutes(browser=[VerifierRoute("/sign-in", sign_in)])


class ToyPlugin:
    name = "toy"
    settings_model = ToySettings

    def build(self, ctx: VerifierContext, settings: ToySettings) -> ToyVerifier:
        return ToyVerifier(ctx, settings)


@pytest.fixture(autouse=True)
def toy_registered() -> Iterator[None]:
    register(ToyPlugin())
    yield
    unregister("toy")


async def test_a_toy_verifier_added_through_the_registry_runs_the_whole_flow(deploy_with: Deploy) -> None:
    async with deploy_with(
        ALICE, CONNECTOR_IDENTITY__VERIFIER="toy", CONNECTOR_IDENTITY__TOY__SUBJECT=ALICE.subject
    ) as deployment:
        assert deployment.connector.verifier.name == "toy"
        async with started(deployment, ALICE) as pending, ScriptedBrowser() as browser:
            page = await browser.get(pending.url)
            to_toy = await browser.submit(page, "continue")
            assert to_toy.status_code == 303
            assert to_toy.headers["location"].startswith(f"{deployment.base_url}/identity/toy/sign-in?handle=")
            final = await browser.follow(to_toy, limit=6)
            assert final.status_code == 200, final.text
            assert "is connected" in final.text
            record = await deployment.connector.elicitation(pending.elicitation_id)
            assert record is not None and record.status is ElicitationStatus.COMPLETED
            assert "identity_challenge" in await events(deployment, pending.elicitation_id)


async def test_the_toy_verifier_naming_someone_else_is_refused_by_the_shared_comparison(deploy_with: Deploy) -> None:
    async with deploy_with(ALICE, CONNECTOR_IDENTITY__VERIFIER="toy", CONNECTOR_IDENTITY__TOY__SUBJECT="bob") as dep:
        async with started(dep, ALICE) as pending, ScriptedBrowser() as browser:
            refused = await browser.follow(await browser.submit(await browser.get(pending.url), "continue"))
            assert refused.status_code == 403
            assert refused.headers["x-connector-error"] == "identity_mismatch"
            assert await dep.connector.runtime.store.grants.find(ALICE, "github") == []
            assert "identity_mismatch" in await events(dep, pending.elicitation_id)


async def test_the_toy_verifiers_own_settings_model_checks_its_section(deploy_with: Deploy) -> None:
    with pytest.raises(ConfigError) as caught:
        async with deploy_with(ALICE, CONNECTOR_IDENTITY__VERIFIER="toy"):
            pass
    assert caught.value.key == "identity.toy.subject"
