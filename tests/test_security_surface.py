"""Findings 6 and 8 of the security review: security headers on error pages (a 500 included), log lines that no
request can forge, a browser-binding cookie the server signed, redirects built from public_base_url (never Host),
a malformed body logged as one WARNING line, and a /readyz that names no database (storage cases on SQLite and
PostgreSQL)."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from service.logs import configure
from service.testing import ScriptedBrowser

from .conftest import POSTGRES_ENV, Deploy, Deployment, fresh_postgres_database
from .hardening_support import asking
from .identity_support import logging_restored
from .security_support import raw_exchange, status_of_raw
from .test_hardening_pages import assert_page_headers


@pytest.fixture
async def deployment(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        yield deployment


async def test_a_500_page_carries_the_security_headers(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        async with deployment.connector.runtime.store.engine.begin() as conn:
            await conn.execute(text("DROP TABLE audit_events"))  # opening the link now fails inside
        answer = await browser.get(pending.url)
    assert answer.status_code == 500
    assert answer.headers["x-connector-error"] == "internal_error"
    assert_page_headers(answer)
    assert "Traceback" not in answer.text and "audit_events" not in answer.text


async def test_no_request_can_forge_a_log_line(deployment: Deployment) -> None:
    lines = io.StringIO()
    with logging_restored():
        configure("text", stream=lines)  # the CLI's own text logging
        async with httpx.AsyncClient(base_url=deployment.base_url) as client:
            await client.get("/connect/%0d%0aFORGED%20INFO%20admin%20logged%20in")
            await client.get("/no/such/page%0aFORGED")
        # A decoded value in a field (a path, a provider's error text) is escaped as well.
        logging.getLogger("service.web").warning("request for %s", "/connect/\r\nFORGED INFO admin logged in")
    logged = lines.getvalue().splitlines()
    assert len([line for line in logged if "FORGED" in line]) == 3  # each on its own request's line
    assert not [line for line in logged if line.startswith("FORGED")]
    assert any("\\r\\nFORGED INFO admin logged in" in line for line in logged)


async def test_a_binding_cookie_the_server_did_not_sign_is_no_binding(deployment: Deployment) -> None:
    chosen = "A" * 43  # a value an attacker planted (a sibling subdomain, an injected header)
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
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


async def test_redirects_are_built_from_the_public_url_never_the_host_header(deployment: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        answer = await client.get("/connect/abc/?x=1", headers={"Host": "evil.example"})
        assert answer.status_code == 307
        assert answer.headers["location"] == f"{deployment.base_url}/connect/abc?x=1"
        odd = await client.get("//evil.example/", headers={"Host": "evil.example"})  # httpx sends it as "/"
        assert "location" not in odd.headers and odd.status_code == 200  # the start page, no redirect


async def test_a_malformed_chunked_body_is_one_warning_line(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with asking(deployment) as ask:
        pending = await ask()
        head = (
            f"POST /connect/{pending.elicitation_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\ncsrf=\r\nzz-not-a-chunk-size\r\n\r\n"
        ).encode()
        answer, _ = await raw_exchange(deployment.base_url, head)
    assert status_of_raw(answer) == 400
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [r for r in caplog.records if r.exc_info] == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all("\n" not in r.getMessage() for r in warnings)


async def test_readyz_names_no_database(
    deployment: Deployment, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = make_url(database_url)
    secret_parts = [part for part in (url.username, url.host, url.database) if part]
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        assert (await client.get("/readyz")).status_code == 200
        async with deployment.connector.runtime.store.engine.begin() as conn:
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
