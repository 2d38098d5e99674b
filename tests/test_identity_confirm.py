"""The `confirm` verifier: the operator's app confirms its logged-in user over an API-key-authenticated call."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from service import Connector, load_settings
from service.core.errors import ConfigError
from service.core.handles import handle_hash
from service.core.records import VerificationRecord
from service.testing import ScriptedBrowser

from .conftest import ALICE, BOB, Deploy, Deployment
from .identity_support import (
    assert_nothing_happened,
    events,
    last_event,
    page_reveals_no_identity,
    started,
)

API_KEY = "operator-api-key-0123456789abcdef"
OPERATOR_URL = "http://127.0.0.1:9/operator/confirm?tenant=acme"  # never fetched: the test plays the operator


def confirm_env(**extra: str) -> dict[str, str]:
    return {
        "CONNECTOR_IDENTITY__VERIFIER": "confirm",
        "CONNECTOR_IDENTITY__CONFIRM__OPERATOR_URL": OPERATOR_URL,
        "CONNECTOR_IDENTITY__CONFIRM__ISSUER": ALICE.issuer,
        "CONNECTOR_IDENTITY__CONFIRM__API_KEY_HASHES": "sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest(),
        **extra,
    }


@pytest.fixture
async def operated(deploy_with: Deploy) -> AsyncIterator[Deployment]:
    async with deploy_with(ALICE, **confirm_env()) as deployment:
        yield deployment


async def to_operator(browser: ScriptedBrowser, connect_url: str) -> str:
    """Open the link and press Continue; return the flow id the operator's page receives."""
    page = await browser.get(connect_url)
    assert page.status_code == 200, page.text
    assert "http://127.0.0.1:9" in page.headers["content-security-policy"]  # form-action covers the hand-off
    leaving = await browser.submit(page, "continue")
    assert leaving.status_code == 303, leaving.text
    location = urlsplit(leaving.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == OPERATOR_URL.split("?")[0]
    query = parse_qs(location.query)
    assert query["tenant"] == ["acme"]  # the operator's own query is kept
    assert set(query) == {"tenant", "flow_id"}  # nothing about the user travels
    return query["flow_id"][0]


async def confirm(
    deployment: Deployment, body: Any, *, key: str | None = API_KEY, scheme: str = "Bearer"
) -> httpx.Response:
    headers = {"Authorization": f"{scheme} {key}"} if key is not None else {}
    async with httpx.AsyncClient() as operator:
        return await operator.post(f"{deployment.base_url}/v1/identity/confirm", json=body, headers=headers)


async def test_the_operator_confirms_alice_and_she_completes(operated: Deployment) -> None:
    async with started(operated, ALICE) as pending:
        async with ScriptedBrowser() as browser:
            flow_id = await to_operator(browser, pending.url)
            answer = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["status"] == "confirmed"
            assert body["next_uri"].startswith(f"{operated.base_url}/identity/confirm/return?code=")
            assert flow_id not in body["next_uri"]  # a second, separate single-use code
            final = await browser.follow(await browser.get(body["next_uri"]))
        assert final.status_code == 200, final.text
        assert "is connected" in final.text
        assert len(await operated.connector.runtime.store.grants.find(ALICE, "github")) == 1
        trail = await events(operated, pending.elicitation_id)
        assert trail.index("identity_challenge") < trail.index("identity_confirmed") < trail.index("verified")
        assert "completed" in trail


async def test_phishing_the_operator_says_bob_is_logged_in(operated: Deployment) -> None:
    async with started(operated, ALICE) as pending:
        async with ScriptedBrowser() as bob:
            flow_id = await to_operator(bob, pending.url)
            answer = await confirm(operated, {"flow_id": flow_id, "user_id": "bob"})
            assert answer.status_code == 403
            assert answer.json()["error"]["code"] == "identity_mismatch"
            assert page_reveals_no_identity(answer.text, ALICE)  # the operator learns nothing about Alice
            refused = await bob.get(answer.json()["next_uri"])
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "identity_mismatch"
        assert "started by a different account" in refused.text
        assert page_reveals_no_identity(refused.text, ALICE, BOB)
        await assert_nothing_happened(operated, pending)
        event = await last_event(operated, "identity_mismatch")
        assert event.elicitation_id == pending.elicitation_id and event.detail["browser_subject"] == "bob"
        assert (await operated.connector.elicitation(pending.elicitation_id)) is not None

        # Counted once, though both the operator's call and Bob's browser were refused.
        record = await operated.connector.runtime.store.audit.list(event="identity_mismatch")
        assert len(record) == 1

        # The link stays open for Alice.
        async with ScriptedBrowser() as alice:
            flow_id = await to_operator(alice, pending.url)
            answer = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
            final = await alice.follow(await alice.get(answer.json()["next_uri"]))
        assert final.status_code == 200, final.text


@pytest.mark.parametrize(
    ("key", "scheme"),
    [
        ("not-the-key", "Bearer"),
        (None, "Bearer"),
        (API_KEY, "Basic"),
        (hashlib.sha256(API_KEY.encode()).hexdigest(), "Bearer"),  # the configured hash is not the key
    ],
    ids=["wrong-key", "no-header", "wrong-scheme", "the-hash-itself"],
)
async def test_a_bad_api_key_is_refused(operated: Deployment, key: str | None, scheme: str) -> None:
    async with started(operated, ALICE) as pending:
        async with ScriptedBrowser() as browser:
            flow_id = await to_operator(browser, pending.url)
            refused = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"}, key=key, scheme=scheme)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"
            assert refused.headers["WWW-Authenticate"].startswith("Bearer")
            await assert_nothing_happened(operated, pending)
            assert "confirm_unauthorized" in await events(operated)
            assert "identity_confirmed" not in await events(operated)

            # The flow id was not used up by the refused call.
            answer = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
            assert answer.status_code == 200


async def test_unknown_and_replayed_flow_ids(operated: Deployment) -> None:
    async with started(operated, ALICE) as pending:
        unknown = await confirm(operated, {"flow_id": "A" * 43, "user_id": "alice"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_flow"
        async with ScriptedBrowser() as browser:
            flow_id = await to_operator(browser, pending.url)
            first = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
            assert first.status_code == 200
            replay = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
            assert replay.status_code == 409 and replay.json()["error"]["code"] == "flow_used"
            assert "next_uri" not in replay.json()
            assert (await last_event(operated, "replay_attempt")).elicitation_id == pending.elicitation_id

            # The browser's return code is single-use too.
            onward = await browser.get(first.json()["next_uri"])
            assert onward.status_code == 303
            again = await browser.get(first.json()["next_uri"])
            assert again.status_code == 400 and again.headers["X-Connector-Error"] == "verification_used"


async def test_a_flow_id_of_another_verifiers_row_counts_for_nothing(operated: Deployment) -> None:
    """A row another verifier wrote (e.g. before the configuration changed) is no hand-off, even if its handle hash
    matches the flow id: the operator's call is refused as an unknown flow and changes nothing."""
    store = operated.connector.runtime.store
    now = operated.connector.clock()
    flow_id = "C" * 43
    async with started(operated, ALICE) as pending:
        await store.verifications.insert(
            VerificationRecord(
                id="other-verifiers-row",
                elicitation_id=pending.elicitation_id,
                verifier="oidc",
                handle_hash=handle_hash("confirm-flow", flow_id),
                return_hash=None,
                browser_binding_hash="x" * 64,
                nonce=None,
                pkce_key_id=None,
                pkce_ciphertext=None,
                outcome=None,
                identity=None,
                created_at=now,
                expires_at=now + timedelta(minutes=10),
                confirmed_at=None,
                used_at=None,
            )
        )
        refused = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "unknown_flow"
        assert (await last_event(operated, "unknown_verification")).detail == {
            "identity_verifier": "confirm",
            "step": "confirm",
        }
        row = await store.verifications.get_by_handle(handle_hash("confirm-flow", flow_id))
        assert row is not None and row.confirmed_at is None and row.return_hash is None
        await assert_nothing_happened(operated, pending)


async def test_the_return_on_another_browser_is_refused(operated: Deployment) -> None:
    async with started(operated, ALICE) as pending:
        async with ScriptedBrowser() as alice:
            flow_id = await to_operator(alice, pending.url)
            answer = await confirm(operated, {"flow_id": flow_id, "user_id": "alice"})
            next_uri = answer.json()["next_uri"]
            async with ScriptedBrowser() as thief:
                await thief.get(pending.url)  # gets its own binding cookie
                refused = await thief.get(next_uri)
            assert refused.status_code == 403
            assert refused.headers["X-Connector-Error"] == "browser_mismatch"
            await assert_nothing_happened(operated, pending)
            assert (await last_event(operated, "browser_mismatch")).elicitation_id == pending.elicitation_id

            final = await alice.follow(await alice.get(next_uri))  # not consumed: Alice's browser goes on
        assert final.status_code == 200, final.text


async def test_a_return_before_the_operator_confirmed_is_refused(operated: Deployment) -> None:
    async with ScriptedBrowser() as browser:
        refused = await browser.get(f"{operated.base_url}/identity/confirm/return?code={'B' * 43}")
    assert refused.status_code == 400
    assert refused.headers["X-Connector-Error"] == "unknown_verification"


@pytest.mark.parametrize(
    "body",
    [
        {"flow_id": "x"},
        {"flow_id": "x", "user_id": 7},
        {"flow_id": "x", "user_id": "alice", "issuer": "https://evil.example"},
        ["flow_id", "user_id"],
        {"flow_id": "A" * 43, "user_id": ""},
    ],
)
async def test_malformed_confirm_bodies_are_400(operated: Deployment, body: Any) -> None:
    answer = await confirm(operated, body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_request"


async def test_oversized_confirm_body_is_refused(operated: Deployment) -> None:
    async with httpx.AsyncClient() as operator:
        answer = await operator.post(
            f"{operated.base_url}/v1/identity/confirm",
            content=b'{"flow_id": "' + b"A" * 20000 + b'", "user_id": "alice"}',
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize(
    ("drop", "key"),
    [
        ("CONNECTOR_IDENTITY__CONFIRM__OPERATOR_URL", "identity.confirm.operator_url"),
        ("CONNECTOR_IDENTITY__CONFIRM__ISSUER", "identity.confirm.issuer"),
        ("CONNECTOR_IDENTITY__CONFIRM__API_KEY_HASHES", "identity.confirm.api_key_hashes"),
    ],
)
def test_incomplete_settings_are_refused(tmp_path: Path, connector_env: dict[str, str], drop: str, key: str) -> None:
    env = {**connector_env, **confirm_env()}
    env.pop(drop)
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(load_settings(config_file, env=env))
    assert caught.value.key == key


def test_api_key_hashes_must_be_sha256_digests(tmp_path: Path, connector_env: dict[str, str]) -> None:
    config_file = tmp_path / "connector.toml"
    config_file.write_text(f'[identity]\nverifier = "confirm"\n[identity.confirm]\napi_key_hashes = ["{API_KEY}"]\n')
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(load_settings(config_file, env=connector_env))
    assert caught.value.key == "identity.confirm.api_key_hashes"
    assert API_KEY not in str(caught.value)


async def test_confirm_calls_for_one_flow_are_rate_limited(deploy_with: Deploy) -> None:
    env = confirm_env(CONNECTOR_RATE_LIMIT__CONFIRM_PER_ELICITATION="2")
    async with deploy_with(ALICE, **env) as deployment:
        async with started(deployment, ALICE) as pending:
            async with ScriptedBrowser() as browser:
                flow_id = await to_operator(browser, pending.url)
            statuses = [
                (await confirm(deployment, {"flow_id": flow_id, "user_id": "alice"})).status_code for _ in range(3)
            ]
            assert statuses == [200, 409, 429]
            assert "rate_limited" in await events(deployment)
