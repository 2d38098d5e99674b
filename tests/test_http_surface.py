"""What a browser (or anyone) reaches over HTTP: security headers on every answer, error pages and a 500 included;
the binding cookie's attributes, and only a cookie the server signed binds; CSRF on the consent form; look-alike
provider hosts flagged; no open redirect, and redirects built from `public_base_url`, never the Host header; log lines
no request can forge; a /readyz that names no database. The https deployment variant is in test_https_deployment.py.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from service import ElicitationStatus
from service.logs import configure
from service.testing import MockOAuthProvider, ScriptedBrowser

from .conftest import ALICE, POSTGRES_ENV, Deploy, Deployment, fresh_postgres_database, write_catalog
from .flow_support import asking, events, query_of, status_of, to_callback, with_query
from .identity_support import logging_restored
from .raw_http_support import raw_exchange, status_of_raw

LOOKALIKE_HOST = "xn--gthub-n2e.com"  # "g\u0456thub.com", a Cyrillic i: Punycode and mixed scripts
IDN_HOST = "xn--e1afmkfd.com"  # "пример.com": Punycode, one script


@pytest.fixture
def connector_env(
    connector_env: dict[str, str], mock_provider: MockOAuthProvider, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Two more providers whose sign-in hosts could mislead a person (never contacted in these tests)."""
    entries = {"github": mock_provider.catalog_entry()}
    for name, host in (("lookalike", LOOKALIKE_HOST), ("idn", IDN_HOST)):
        entries[name] = {
            "display_name": "GitHub",
            "authorization_endpoint": f"https://{host}/login/oauth/authorize",
            "token_endpoint": f"https://{host}/login/oauth/access_token",
        }
    write_catalog(Path(connector_env["CONNECTOR_PROVIDERS__CATALOG"]), entries)
    env = dict(connector_env)
    for name in ("LOOKALIKE", "IDN"):
        env[f"CONNECTOR_PROVIDER_{name}_CLIENT_ID"] = "client"
        env[f"CONNECTOR_PROVIDER_{name}_CLIENT_SECRET"] = "secret-value"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def csp_directives(response: httpx.Response) -> dict[str, list[str]]:
    policy = response.headers["content-security-policy"]
    return {part.split()[0]: part.split()[1:] for part in (p.strip() for p in policy.split(";")) if part}


def assert_page_headers(response: httpx.Response) -> None:
    csp = csp_directives(response)
    assert csp["default-src"] == ["'none'"]
    assert "script-src" not in csp  # so default-src 'none' applies: no script at all, inline or not
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"]
    assert "'unsafe-inline'" not in response.headers["content-security-policy"]
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert "strict-transport-security" not in response.headers  # plain http on loopback
    if response.headers.get("content-type", "").startswith("text/html"):
        assert "<script" not in response.text.lower()
        assert not re.search(r"\son[a-z]+\s*=", response.text, re.IGNORECASE)  # no inline event handlers


async def test_every_answer_carries_the_security_headers(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        page = await browser.get(pending.url)
        assert page.status_code == 200
        # The consent form may post to us, and the redirect after it may go only to the provider's origin.
        assert csp_directives(page)["form-action"] == ["'self'", deployment.provider.base_url]
        sent = await browser.submit(page, "continue")
        answers = [page, sent]
        answers.append(await browser.get(await to_callback(browser, pending.url)))
        answers.append(await browser.get(f"{deployment.base_url}/connect/unknown-id"))
        refused = await browser.get(f"{deployment.base_url}/callback/github?state=forged")
        answers += [refused, await browser.follow(refused)]  # the refusal, at its clean address
        answers.append(await browser.get(f"{deployment.base_url}/static/style.css"))
        answers.append(await browser.get(f"{deployment.base_url}/healthz"))
        answers.append(await browser.get(f"{deployment.base_url}/no/such/page"))
        answers.append(await browser.client.delete(pending.url))
    assert [a.status_code for a in answers] == [200, 303, 303, 404, 303, 400, 200, 200, 404, 405]
    for answer in answers:
        assert_page_headers(answer)
    for answer in answers[1:]:
        assert csp_directives(answer)["form-action"] == ["'self'"]


async def test_binding_cookie_attributes_on_loopback_http(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        page = await browser.get(pending.url)
        cookies = page.headers.get_list("set-cookie")
        assert len(cookies) == 1
        name_value, *attributes = [part.strip() for part in cookies[0].split(";")]
        name, value = name_value.split("=", 1)
        assert name == "connector-browser"  # __Host- requires Secure, which plain http cannot have
        assert len(value) >= 43
        flags = {a.split("=")[0].lower(): (a.split("=", 1)[1] if "=" in a else True) for a in attributes}
        assert flags.get("httponly") is True
        assert str(flags.get("samesite")).lower() == "lax"
        assert flags.get("path") == "/"
        assert "domain" not in flags
        assert "secure" not in flags
        assert 0 < int(str(flags["max-age"])) <= 3600  # short-lived
        # The cookie is set once; a second visit keeps it.
        again = await browser.get(pending.url)
        assert again.headers.get_list("set-cookie") == []


# --- CSRF ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attack", ["missing", "wrong", "other_browser", "no_cookie"])
@pytest.mark.parametrize("action", ["continue", "decline"])
async def test_consent_post_without_a_valid_csrf_token_is_refused(
    deployment: Deployment, attack: str, action: str
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as alice, ScriptedBrowser() as mallory:
        pending = await ask()
        page = await alice.get(pending.url)
        token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        if attack == "missing":
            posted = await alice.client.post(pending.url, data={"action": action})
        elif attack == "wrong":
            posted = await alice.client.post(pending.url, data={"csrf": token[:-2] + "AA", "action": action})
        elif attack == "other_browser":  # a valid token, replayed from a browser with another binding
            await mallory.get(pending.url)
            posted = await mallory.client.post(pending.url, data={"csrf": token, "action": action})
        else:  # a cross-site form post arrives without the SameSite=Lax cookie
            async with httpx.AsyncClient() as bare:
                posted = await bare.post(pending.url, data={"csrf": token, "action": action})
        assert posted.status_code == 403
        assert posted.headers["x-connector-error"] == "csrf_failed"
        assert "location" not in posted.headers
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.CONSENTED
        recorded = await events(deployment, pending.elicitation_id)
        assert "verified" not in recorded and "declined" not in recorded
        assert "csrf_failed" in recorded
        # The genuine form still works afterwards.
        assert (await alice.submit(page, action)).status_code in (200, 303)


# --- hosts a person could misread --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "shown", "warning"),
    [
        ("github", None, None),
        ("lookalike", "g\u0456thub.com", "mixes letters from different alphabets"),
        ("idn", "пример.com", "uses international characters"),
    ],
)
async def test_consent_page_highlights_the_provider_host_and_warns_about_lookalikes(
    deployment: Deployment, provider: str, shown: str | None, warning: str | None
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask(provider=provider)
        page = await browser.get(pending.url)
    assert page.status_code == 200
    host = {"github": deployment.provider.host, "lookalike": LOOKALIKE_HOST, "idn": IDN_HOST}[provider]
    assert f'<span class="host">{host}</span>' in page.text
    if warning is None:
        assert 'class="warning"' not in page.text
        return
    assert shown is not None
    assert page.text.count('class="warning"') == 1
    assert warning in page.text and "sign-in address" in page.text and shown in page.text


# --- no open redirects -------------------------------------------------------------------------------------

EVIL = "https://evil.example/steal"
REDIRECT_PARAMS = {"return_to": EVIL, "next": EVIL, "redirect_uri": EVIL, "redirect": EVIL, "url": EVIL}


async def test_no_parameter_steers_a_redirect(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        page = await browser.client.get(pending.url, params=REDIRECT_PARAMS)
        browser.responses.append(page)
        assert page.status_code == 200 and "location" not in page.headers
        assert f'action="/connect/{pending.elicitation_id}"' in page.text  # the form carries no parameters on
        token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        sent = await browser.client.post(
            pending.url, params=REDIRECT_PARAMS, data={"csrf": token, "action": "continue", **REDIRECT_PARAMS}
        )
        assert sent.status_code == 303
        location = sent.headers["location"]
        assert location.startswith(deployment.provider.base_url + "/authorize?")
        assert query_of(location)["redirect_uri"] == f"{deployment.base_url}/callback/github"
        at_provider = await browser.get(location)
        callback = at_provider.headers["location"]
        done = await browser.client.get(with_query(callback, **REDIRECT_PARAMS))
        assert done.status_code == 303 and done.headers["location"] == f"/connect/{pending.elicitation_id}/done"
    assert EVIL not in done.text


@pytest.mark.parametrize(
    "path", ["//evil.example/", "/connect//evil.example", "/callback/github/", "/%2F%2Fevil.example/", "/connect/"]
)
async def test_odd_paths_never_redirect_off_site(deployment: Deployment, path: str) -> None:
    async with httpx.AsyncClient() as client:
        answer = await client.get(deployment.base_url + path)
    location = answer.headers.get("location")
    if location is not None:
        assert httpx.URL(deployment.base_url).join(location).host == "127.0.0.1"
        assert not location.startswith("//")


# --- on SQLite and PostgreSQL: error pages, cookies, redirects, logs, readiness ---------------------------


@pytest.fixture
async def deployment_any_store(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        yield deployment


async def test_a_500_page_carries_the_security_headers(deployment_any_store: Deployment) -> None:
    async with asking(deployment_any_store) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        async with deployment_any_store.connector.runtime.store.engine.begin() as conn:
            await conn.execute(text("DROP TABLE audit_events"))  # opening the link now fails inside
        answer = await browser.get(pending.url)
    assert answer.status_code == 500
    assert answer.headers["x-connector-error"] == "internal_error"
    assert_page_headers(answer)
    assert "Traceback" not in answer.text and "audit_events" not in answer.text


async def test_no_request_can_forge_a_log_line(deployment_any_store: Deployment) -> None:
    lines = io.StringIO()
    with logging_restored():
        configure("text", stream=lines)  # the CLI's own text logging
        async with httpx.AsyncClient(base_url=deployment_any_store.base_url) as client:
            await client.get("/connect/%0d%0aFORGED%20INFO%20admin%20logged%20in")
            await client.get("/no/such/page%0aFORGED")
        # A decoded value in a field (a path, a provider's error text) is escaped as well.
        logging.getLogger("service.web").warning("request for %s", "/connect/\r\nFORGED INFO admin logged in")
    logged = lines.getvalue().splitlines()
    assert len([line for line in logged if "FORGED" in line]) == 3  # each on its own request's line
    assert not [line for line in logged if line.startswith("FORGED")]
    assert any("\\r\\nFORGED INFO admin logged in" in line for line in logged)


async def test_a_binding_cookie_the_server_did_not_sign_is_no_binding(deployment_any_store: Deployment) -> None:
    chosen = "A" * 43  # a value an attacker planted (a sibling subdomain, an injected header)
    async with asking(deployment_any_store) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        browser.client.cookies.set("connector-browser", chosen)
        page = await browser.get(pending.url)
        [cookie] = page.headers.get_list("set-cookie")
        issued = cookie.split(";", 1)[0].split("=", 1)[1]
        assert issued != chosen and not issued.startswith(chosen)
        binding, key_id, mac = issued.split(".")
        assert len(binding) >= 43 and key_id == "k1" and mac
        # A tampered signature is no binding either: the consent form's token does not verify.
        tampered = mac[:-2] + ("AB" if mac.endswith("AA") else "AA")
        browser.client.cookies.clear()
        browser.client.cookies.set("connector-browser", f"{binding}.{key_id}.{tampered}")
        answer = await browser.submit(page, "continue")
    assert answer.status_code == 403 and answer.headers["x-connector-error"] == "csrf_failed"


async def test_redirects_are_built_from_the_public_url_never_the_host_header(deployment_any_store: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment_any_store.base_url) as client:
        answer = await client.get("/connect/abc/?x=1", headers={"Host": "evil.example"})
        assert answer.status_code == 307
        assert answer.headers["location"] == f"{deployment_any_store.base_url}/connect/abc?x=1"
        odd = await client.get("//evil.example/", headers={"Host": "evil.example"})  # httpx sends it as "/"
        assert "location" not in odd.headers and odd.status_code == 200  # the start page, no redirect


async def test_a_malformed_chunked_body_is_one_warning_line(
    deployment_any_store: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with asking(deployment_any_store) as ask:
        pending = await ask()
        head = (
            f"POST /connect/{pending.elicitation_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\ncsrf=\r\nzz-not-a-chunk-size\r\n\r\n"
        ).encode()
        answer, _ = await raw_exchange(deployment_any_store.base_url, head)
    assert status_of_raw(answer) == 400
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [r for r in caplog.records if r.exc_info] == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all("\n" not in r.getMessage() for r in warnings)


async def test_readyz_names_no_database(
    deployment_any_store: Deployment, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = make_url(database_url)
    secret_parts = [part for part in (url.username, url.host, url.database) if part]
    async with httpx.AsyncClient(base_url=deployment_any_store.base_url) as client:
        assert (await client.get("/readyz")).status_code == 200
        async with deployment_any_store.connector.runtime.store.engine.begin() as conn:
            await conn.execute(text("DELETE FROM alembic_version"))  # as after restoring an empty dump
        with caplog.at_level(logging.WARNING, logger="service.web"):
            unready = await client.get("/readyz")
    assert unready.status_code == 503
    body = unready.json()
    assert body["code"] == "schema_not_current" and "is not migrated" in body["message"]
    for part in secret_parts:
        assert part not in unready.text
    assert any(str(url.database) in r.getMessage() for r in caplog.records)  # the operator's log has the details


@pytest.mark.postgres
async def test_readyz_names_no_database_when_it_is_down(deploy_with: Deploy) -> None:
    async with fresh_postgres_database() as url, deploy_with(CONNECTOR_DATABASE__URL=url) as deployment:
        admin = create_async_engine(os.environ[POSTGRES_ENV], isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f'DROP DATABASE "{make_url(url).database}" WITH (FORCE)')
        finally:
            await admin.dispose()
        async with httpx.AsyncClient(base_url=deployment.base_url) as client:
            unready = await client.get("/readyz")
    assert unready.status_code == 503 and unready.json()["code"] == "database_unreachable"
    parsed = make_url(url)
    for part in (parsed.username, parsed.host, parsed.database):
        assert part is not None and part not in unready.text


MALFORMED_CHUNKS = b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\nxx\r\n"  # a chunk size that is no number


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/identity/confirm"),  # 405 at once, before the app reads anything
        ("POST", "/v1/nothing-here"),  # 404 at once
        ("POST", "/v1/elicitations"),  # reads the body: meets the server's close
        ("POST", "/connect/abc"),
    ],
)
async def test_a_body_the_server_refuses_mid_request_is_answered_once_without_a_traceback(
    deploy_with: Deploy, caplog: pytest.LogCaptureFixture, method: str, path: str
) -> None:
    """uvicorn answers a malformed chunked body with its own 400 and closes while the app may still be answering
    the same request; the app's answer is dropped (a warning line), never a second answer, an ERROR or a traceback."""
    caplog.set_level(logging.INFO)
    async with deploy_with(ALICE, CONNECTOR_IDENTITY__VERIFIER="confirm", **CONFIRM) as deployment:
        for _ in range(3):
            head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + MALFORMED_CHUNKS
            answer, _ = await raw_exchange(deployment.base_url, head)
            assert status_of_raw(answer) == 400 and answer.count(b"HTTP/1.1 ") == 1
    problems = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert problems == [], [r.getMessage() for r in problems]


CONFIRM = {
    "CONNECTOR_IDENTITY__CONFIRM__OPERATOR_URL": "http://127.0.0.1:9/operator/confirm",
    "CONNECTOR_IDENTITY__CONFIRM__ISSUER": "https://idp.example.com",
    "CONNECTOR_IDENTITY__CONFIRM__API_KEY_HASHES": "0" * 64,
}
