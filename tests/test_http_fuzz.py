"""A seeded fuzz of every route on PostgreSQL: 10,000+ malformed requests (paths, ids, query parameters, forms, JSON
bodies, content types, cookies, API keys, methods), with a few real elicitations among the targets.

Every route: the browser pages, the provider callback, the identity verifiers' routes (confirm's API and return,
oidc's callback), the `/v1` agent API (elicitations, answers, cancels, grants, the token proxy, the event stream,
the OpenAPI document), health, metrics and static files, and paths that match nothing.

It asserts: no answer of 500 or more; no row written or changed by a rejected request in any table but the audit
trail, whose rows from requests without credentials stay within the configured budget; the real elicitations did
not move; no traceback, and no ERROR line, in the log.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import socket
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
from sqlalchemy import select

from service import ElicitationStatus, Identity
from service.store import Store
from service.store.tables import audit_events, metadata, replicas
from service.testing import MockOAuthProvider

from .api_support import make_key
from .conftest import ALICE, Deploy, Deployment, deploy, fresh_postgres_database, write_catalog
from .flow_support import asking
from .identity_support import LoopbackIdP, serve_idp, wait_status

pytestmark = pytest.mark.postgres

SEED = 20261214
OPERATOR_KEY = "fuzz-operator-key-0123456789abcdef"
QUIET_LIMITS = {  # the limits still count every request, but refuse none: every input reaches the handlers
    f"CONNECTOR_RATE_LIMIT__{name}": "100000000"
    for name in (
        "CONNECT_PER_ADDRESS",
        "CONNECT_PER_ELICITATION",
        "CALLBACK_PER_ADDRESS",
        "CALLBACK_PER_ELICITATION",
        "CONFIRM_PER_ADDRESS",
        "CONFIRM_PER_ELICITATION",
    )
}
AUDIT_BUDGET = 600  # rate_limit.audit_total: rows per window from requests without any credential

NASTY = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\r\n",
    "x\r\nSet-Cookie: a=b",
    "\t",
    "\x1b[31mred",
    "\x7f",
    "\u0085",
    "\u202e",
    "\ud800",
    "\ufeff",
    "😀" * 3,
    "e\u0301",
    "../../etc/passwd",
    "..%2f..%2f",
    "%00",
    "%ff%fe",
    "%",
    "%%%",
    "<script>alert(1)</script>",
    "' OR '1'='1",
    '"; DROP TABLE grants; --',
    "{0}{1}%s%n",
    "${jndi:ldap://x}",
    "null",
    "[]",
    "{}",
    "-1",
    "99999999999999999999999",
    "k1.",
    ".",
    "..",
    "//evil.example",
    "https://evil.example/steal",
    "javascript:alert(1)",
]


def nasty(rng: random.Random, valid: list[str]) -> str:
    """A hostile string: a known-bad one, a long one, random bytes, or a valid value with something added."""
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(NASTY)
    if roll < 0.5:
        return rng.choice("aZ9_-.~%") * rng.choice([65, 129, 257, 513, 4097, 9000])
    if roll < 0.7:
        return "".join(chr(rng.randrange(0, 0x250)) for _ in range(rng.randrange(1, 40)))
    if roll < 0.85 and valid:
        base = rng.choice(valid)
        cut = rng.randrange(0, len(base) + 1)
        return base[:cut] + rng.choice(NASTY) + base[cut:]
    return rng.choice(valid) if valid else ""


@dataclass
class Target:
    """What the fuzz knows about the deployment: real ids and handles to mutate."""

    base_url: str
    elicitation_ids: list[str]
    api_key: str
    providers: list[str] = field(default_factory=lambda: ["github", "nosuch", "GitHub"])


Request = tuple[str, str, dict[str, Any]]  # method, path (already percent-encoded where it should be), httpx kwargs


def quote_some(rng: random.Random, text: str) -> str:
    """Percent-encode `text` for a URL, sometimes leaving characters raw that a browser would encode."""
    encoded = urllib.parse.quote(text, safe="-._~", errors="surrogatepass")  # all but ASCII letters, digits, -._~
    if rng.random() < 0.1:
        encoded = encoded.replace("%2F", "/").replace("%25", "%")
    return encoded


def query(rng: random.Random, names: list[str], valid: list[str]) -> str:
    parts = []
    for _ in range(rng.choice([0, 1, 2, 3, 5, 40])):
        name = rng.choice([*names, nasty(rng, names)])
        parts.append(f"{quote_some(rng, name)}={quote_some(rng, nasty(rng, valid))}")
    return "&".join(parts)


def form_body(rng: random.Random) -> dict[str, Any]:
    fields = [
        ("csrf", nasty(rng, ["k1.AAAA", "k1." + "A" * 43])),
        ("action", rng.choice(["continue", "decline", *NASTY])),
    ]
    if rng.random() < 0.3:
        fields.append((nasty(rng, ["note"]), nasty(rng, ["x"])))
    if rng.random() < 0.1:
        fields.append(("action", "decline"))
    body = "&".join(f"{quote_some(rng, k)}={quote_some(rng, v)}" for k, v in fields)
    content_type = rng.choice(
        [
            "application/x-www-form-urlencoded",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json",
            "text/plain",
            "",
            "application/x-www-form-urlencoded; charset=latin-1",
            nasty(rng, ["text/html"]).encode("ascii", "ignore").decode() or "x",
        ]
    )
    raw = body.encode("utf-8", "surrogatepass")
    if rng.random() < 0.1:
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    if rng.random() < 0.05:
        raw = b"csrf=" + b"A" * 5000
    headers = {"content-type": content_type} if content_type else {}
    return {"content": raw, "headers": headers}


def json_body(rng: random.Random, value: Any) -> tuple[bytes, dict[str, str]]:
    """A JSON body and its content type: `value` as it is, or something broken (bytes, nesting, size, types)."""
    roll = rng.random()
    if roll < 0.5:
        raw = json.dumps(value).encode("utf-8", "surrogatepass")
    elif roll < 0.65:
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
    elif roll < 0.75:
        raw = ("[" * rng.choice([20, 500, 5000])).encode()
    elif roll < 0.8:
        raw = json.dumps({"padding": "A" * rng.choice([9000, 20000])}).encode()
    else:
        raw = json.dumps(rng.choice([[value], None, 1e308, "text", {"nested": [value] * 3}])).encode()
    content_type = rng.choice(["application/json", "application/json", "text/plain", "application/json; charset=x"])
    return raw, {"content-type": content_type}


def confirm_request(rng: random.Random) -> dict[str, Any]:
    """The operator's confirm call: its key mostly right, its body mostly wrong."""
    value = {"flow_id": nasty(rng, ["A" * 43]), "user_id": nasty(rng, ["alice", "bob"])}
    if rng.random() < 0.3:
        value[nasty(rng, ["extra"])] = nasty(rng, ["x"])
    raw, headers = json_body(rng, value)
    auth = rng.choice([f"Bearer {OPERATOR_KEY}", f"Bearer {OPERATOR_KEY}", f"Bearer {nasty(rng, [OPERATOR_KEY])}", ""])
    if auth:
        headers["authorization"] = auth
    return {"content": raw, "headers": headers}


def api_auth(rng: random.Random, key: str) -> dict[str, str]:
    """Mostly the real key (so requests get past it), sometimes none, a forged one, or another scheme."""
    roll = rng.random()
    if roll < 0.75:
        return {"authorization": f"Bearer {key}"}
    if roll < 0.85:
        return {}
    return {"authorization": rng.choice(["Bearer ", "Basic ", "bearer ", ""]) + nasty(rng, [key])}


def create_body(rng: random.Random) -> Any:
    """A create request that is always wrong somewhere: an unknown field at least, often more."""
    body: dict[str, Any] = {
        "user": {"issuer": nasty(rng, [ALICE.issuer]), "subject": nasty(rng, [ALICE.subject])},
        "provider": nasty(rng, ["github"]),
        "scopes": rng.choice([[nasty(rng, ["repo"])], nasty(rng, ["repo"]), [], None, [1, 2], ["repo"] * 300]),
        "scope": rng.choice(
            [
                {"sessionId": nasty(rng, ["s"]), "toolCallId": nasty(rng, ["c"])},
                {"requestId": nasty(rng, ["1"])},
                [],
                None,
            ]
        ),
        nasty(rng, ["x-fuzz"]) or "x-fuzz": nasty(rng, ["1"]),
    }
    for name in rng.sample(sorted(body), rng.randrange(0, 3)):
        del body[name]
    body["x-fuzz"] = True  # unknown to the API: the request is refused whatever else happens to be right
    return body


def api_request(rng: random.Random, target: Target) -> Request:
    ids = target.elicitation_ids
    eid = quote_some(rng, nasty(rng, ids))
    headers = api_auth(rng, target.api_key)
    if rng.random() < 0.5:
        headers |= {
            "connector-user-issuer": nasty(rng, [ALICE.issuer]),
            "connector-user-subject": nasty(rng, ["alice"]),
        }
    kind = rng.choice(
        ["create", "create", "get", "answer", "cancel", "grants", "delete", "proxy", "events", "openapi", "webhook"]
    )
    kwargs: dict[str, Any] = {"headers": headers}
    if kind == "create":
        method, path = rng.choice(["POST", "POST", "PUT"]), "/v1/elicitations"
        kwargs["content"], content_type = json_body(rng, create_body(rng))
        kwargs["headers"] |= content_type
        if rng.random() < 0.3:
            kwargs["headers"]["idempotency-key"] = nasty(rng, ["k-1"])
    elif kind == "get":
        method, path = "GET", f"/v1/elicitations/{eid}?" + query(rng, ["wait"], ["0"])
    elif kind == "answer":
        method, path = "POST", f"/v1/elicitations/{eid}/answer"
        answer = {"answer": nasty(rng, ["accept", "decline", "cancel", "client_error"]), "code": nasty(rng, ["1"])}
        kwargs["content"], content_type = json_body(rng, answer)
        kwargs["headers"] |= content_type
    elif kind == "cancel":
        method, path = "POST", f"/v1/elicitations/{eid}/cancel"
        if rng.random() < 0.5:
            kwargs["content"], content_type = json_body(rng, {"reason": nasty(rng, ["x"])})
            kwargs["headers"] |= content_type
    elif kind == "grants":
        method, path = (
            "GET",
            "/v1/grants?" + query(rng, ["issuer", "subject", "provider"], [ALICE.issuer, "alice", "github"]),
        )
    elif kind == "delete":
        method, path = "DELETE", "/v1/grants/" + quote_some(rng, nasty(rng, ["A" * 22]))
    elif kind == "proxy":
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
        path = (
            f"/v1/proxy/{quote_some(rng, nasty(rng, target.providers))}/{quote_some(rng, nasty(rng, ['user/repos']))}"
        )
        if method in ("POST", "PUT", "PATCH"):
            kwargs |= {"content": nasty(rng, ["{}"]).encode("utf-8", "surrogatepass")}
    elif kind == "webhook":  # no endpoint exists: whatever the body, a secret rotation finds nothing to change
        method = rng.choice(["POST", "POST", "GET", "PUT"])
        path = f"/v1/webhooks/{quote_some(rng, nasty(rng, ['wh_' + 'A' * 16]))}/secret"
        if rng.random() < 0.7:
            kwargs["content"], content_type = json_body(rng, {"overlapSeconds": rng.choice([0, -1, 2**63, "60"])})
            kwargs["headers"] |= content_type
    elif kind == "events":
        method, path = "GET", "/v1/events?" + query(rng, ["after"], ["1"])
        if rng.random() < 0.5:
            kwargs["headers"]["last-event-id"] = nasty(rng, ["1"])
    else:
        method, path = rng.choice(["GET", "POST"]), "/v1/openapi.json?" + query(rng, ["x"], [])
    return method, path, kwargs


def cookies(rng: random.Random) -> dict[str, str]:
    if rng.random() < 0.5:
        return {}
    value = nasty(rng, ["A" * 43 + ".k1." + "B" * 43])
    return {"cookie": "connector-browser=" + value.encode("ascii", "ignore").decode().replace(";", "")}


def generate(rng: random.Random, target: Target, routes: list[str]) -> Request:
    """One malformed request to one of `routes` (names of the generators below)."""
    ids = target.elicitation_ids
    method = rng.choice(["GET", "GET", "POST", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"])
    route = rng.choice(routes)
    kwargs: dict[str, Any] = {"headers": cookies(rng)}
    if rng.random() < 0.2:
        kwargs["headers"]["x-forwarded-for"] = nasty(rng, ["203.0.113.9"]).encode("ascii", "ignore").decode()
    if route == "connect":
        path = "/connect/" + quote_some(rng, nasty(rng, ids))
        if method == "POST":
            kwargs |= {**form_body(rng), "headers": {**kwargs["headers"], **form_body(rng)["headers"]}}
        path += "?" + query(rng, ["x", "elicitationId"], ids) if rng.random() < 0.4 else ""
    elif route == "connect_query":
        path = "/connect?" + query(rng, ["elicitationId", "elicitationId", "x"], ids)
    elif route == "callback":
        provider = quote_some(rng, nasty(rng, target.providers))
        path = f"/callback/{provider}?" + query(rng, ["state", "code", "error", "error_description", "iss"], ["A" * 43])
    elif route == "confirm_api":
        path = "/v1/identity/confirm"
        method = rng.choice(["POST", "POST", "POST", "GET", "PUT"])
        kwargs |= confirm_request(rng)
        kwargs["headers"] = {**cookies(rng), **kwargs["headers"]}
    elif route == "confirm_return":
        path = "/identity/confirm/return?" + query(rng, ["code", "state"], ["A" * 43])
    elif route == "oidc_callback":
        path = "/identity/oidc/callback?" + query(rng, ["state", "code", "error", "iss", "session_state"], ["A" * 43])
    elif route == "api":
        method, path, kwargs = api_request(rng, target)
    elif route == "health":
        path = rng.choice(["/healthz", "/readyz", "/metrics"]) + (
            "?" + query(rng, ["x"], []) if rng.random() < 0.5 else ""
        )
    elif route == "static":
        path = "/static/" + quote_some(rng, nasty(rng, ["style.css"]))
    else:  # anything at all
        path = "/" + "/".join(
            quote_some(rng, nasty(rng, ["connect", "callback", "identity", "v1"])) for _ in range(rng.randrange(1, 5))
        )
    if method in ("GET", "HEAD", "DELETE", "OPTIONS") and "content" in kwargs and rng.random() < 0.7:
        kwargs.pop("content")
    # What a client can put on the wire at all: visible ASCII in headers, a request line of bounded length
    # (beyond uvicorn's limit a few are left, to be refused there).
    kwargs["headers"] = {name: sendable(value) for name, value in kwargs["headers"].items()}
    return method, path[: rng.choice([12000, 12000, 12000, 64000])], kwargs


def sendable(value: str) -> str:
    return "".join(ch for ch in value if " " <= ch <= "~").strip()


@dataclass
class Outcome:
    statuses: Counter[int] = field(default_factory=Counter)
    by_route: Counter[tuple[str, int]] = field(default_factory=Counter)  # (route, status)
    server_errors: list[tuple[str, str, int]] = field(default_factory=list)
    sent: int = 0


async def fuzz(target: Target, routes: list[str], count: int, seed: int, concurrency: int = 12) -> Outcome:
    rng = random.Random(seed)
    requests = [generate(rng, target, routes) for _ in range(count)]
    outcome = Outcome()
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    origin = httpx.URL(target.base_url)
    assert origin.host and origin.port
    # httpx's own transport, without httpx's URL checks (character by character, several times a request). Idle
    # connections are dropped well before uvicorn's 5-second keep-alive ends them: on a loaded machine the server
    # may otherwise close one just as the client sends on it (a ReadError that says nothing of the server).
    async with httpcore.AsyncConnectionPool(max_connections=concurrency, keepalive_expiry=1.0, retries=0) as pool:

        async def worker() -> None:
            while not queue.empty():
                method, path, kwargs = queue.get_nowait()
                url = httpcore.URL(
                    scheme=b"http", host=origin.host, port=origin.port, target=path.encode("ascii") or b"/"
                )
                status = await send(pool, method, url, path, kwargs)
                outcome.sent += 1
                outcome.statuses[status] += 1
                outcome.by_route[route_of(path), status] += 1
                if status >= 500:
                    outcome.server_errors.append((method, path[:200], status))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcome


KNOWN_ROUTES = (
    "/connect",
    "/callback/",
    "/identity/confirm/return",
    "/identity/oidc/callback",
    "/v1/identity/confirm",
    "/v1/elicitations",
    "/v1/grants",
    "/v1/webhooks",
    "/v1/proxy/",
    "/v1/events",
    "/v1/openapi.json",
    "/healthz",
    "/readyz",
    "/metrics",
    "/static/",
)


def route_of(path: str) -> str:
    """The route a request was aimed at, for the summary ("other" for paths that match none)."""
    plain = path.split("?", 1)[0]
    return next((route for route in KNOWN_ROUTES if plain.startswith(route)), "other")


# What httpx sends with every request unless told otherwise.
CLIENT_HEADERS = {"accept": "*/*", "accept-encoding": "gzip, deflate", "connection": "keep-alive", "user-agent": "fuzz"}
TIMEOUTS = {"connect": 30.0, "read": 30.0, "write": 30.0, "pool": 30.0}


async def send(
    pool: httpcore.AsyncConnectionPool, method: str, url: httpcore.URL, path: str, kwargs: dict[str, Any]
) -> int:
    """The status of the answer; -1 when the server closed the connection instead (a request it could not parse).

    A stream that opens (the event stream) is closed as soon as its status is known.
    """
    headers = list({**CLIENT_HEADERS, **kwargs["headers"]}.items())
    try:
        async with pool.stream(
            method, url, headers=headers, content=kwargs.get("content"), extensions={"timeout": TIMEOUTS}
        ) as answer:
            if not path.startswith("/v1/events"):
                await answer.aread()
            return answer.status
    except (httpcore.RemoteProtocolError, httpcore.ReadError):
        return -1


async def snapshot(store: Store) -> dict[str, str]:
    """A digest of every row of every table but the audit trail and the replicas' heartbeats (which tick)."""
    digests = {}
    async with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            if table in (audit_events, replicas):
                continue
            rows = (await conn.execute(select(table).order_by(*table.primary_key.columns))).all()
            digests[table.name] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return digests


def problems_in_log(records: list[logging.LogRecord]) -> list[str]:
    return [
        f"{r.levelname} {r.name}: {r.getMessage()[:200]}"
        for r in records
        if r.exc_info or r.levelno >= logging.ERROR or "Traceback" in r.getMessage()
    ]


UNATTRIBUTED = {"csrf_failed", "unknown_state", "confirm_unauthorized", "unknown_verification"}
ONE_WINDOW = {"CONNECTOR_RATE_LIMIT__WINDOW_SECONDS": "86400", "CONNECTOR_RATE_LIMIT__AUDIT_PER_ADDRESS": "20"}


@pytest.fixture
async def deploy_with(
    connector_env: dict[str, str], tmp_path: Path, mock_provider: MockOAuthProvider, loopback_socket: socket.socket
) -> AsyncIterator[Deploy]:
    """`deploy_with` with the mock provider served on loopback instead of through respx: respx patches httpcore,
    which the fuzzing client uses too, and matching each of its requests against the routes cost more than the
    server's answer."""
    async with mock_provider.serve_http():
        write_catalog(Path(connector_env["CONNECTOR_PROVIDERS__CATALOG"]), {"github": mock_provider.catalog_entry()})

        def make(
            user: Identity | None = None, schema_revision: str = "head", **overrides: str
        ) -> AbstractAsyncContextManager[Deployment]:
            return deploy(connector_env, tmp_path, mock_provider, loopback_socket, user, schema_revision, **overrides)

        yield make


async def run_fuzz(
    deploy_with: Deploy, caplog: pytest.LogCaptureFixture, routes: list[str], count: int, seed: int, **settings: str
) -> Outcome:
    """Deploy on a fresh PostgreSQL database with `settings`, start three real elicitations, fuzz, and check."""
    caplog.set_level(logging.INFO)  # every line the service writes; the fuzzing client's own debug lines are noise
    caplog.set_level(logging.WARNING, logger="httpcore")
    caplog.set_level(logging.WARNING, logger="httpx")
    async with (
        fresh_postgres_database(migrated=True) as url,
        deploy_with(ALICE, CONNECTOR_DATABASE__URL=url, **QUIET_LIMITS, **ONE_WINDOW, **settings) as deployment,
    ):
        store = deployment.connector.runtime.store
        async with asking(deployment) as ask:
            pending = [await ask(user=ALICE) for _ in range(3)]
            for one in pending:
                await wait_status(deployment, one.elicitation_id, ElicitationStatus.CONSENTED)
            api_key = await make_key(store)
            before = await snapshot(store)
            audit_before = len(await store.audit.list())
            caplog.clear()
            target = Target(deployment.base_url, [one.elicitation_id for one in pending], api_key)
            outcome = await fuzz(target, routes, count, seed)
            records = list(caplog.records)
            assert outcome.sent == count
            assert outcome.statuses[-1] <= count // 100, outcome.statuses  # closed without an answer: rare
            assert outcome.server_errors == [], outcome.server_errors[:20]
            assert problems_in_log(records) == []
            # Nothing but the audit trail changed: no elicitation moved, no flow, grant or verification appeared.
            assert await snapshot(store) == before
            written = Counter(row.event for row in (await store.audit.list())[audit_before:])
            unattributed = sum(n for event, n in written.items() if event in UNATTRIBUTED)
            assert unattributed <= 20 and written["audit_suppressed"] <= 1, written
            assert set(written) <= {*UNATTRIBUTED, "audit_suppressed", "opened"}, written
            assert written["opened"] <= outcome.statuses[200]  # a GET of a real link is no rejection
    print(f"fuzz {routes}: {outcome.sent} requests, statuses {sorted(outcome.statuses.items())}, audit {dict(written)}")
    print("by route:", sorted(outcome.by_route.items()))
    return outcome


@pytest.mark.duration(18)
async def test_fuzz_every_route_with_the_confirm_verifier(
    deploy_with: Deploy, caplog: pytest.LogCaptureFixture
) -> None:
    routes = [
        "connect",
        "connect_query",
        "callback",
        "confirm_api",
        "confirm_return",
        "api",
        "api",
        "health",
        "static",
        "any",
    ]
    outcome = await run_fuzz(deploy_with, caplog, routes, 8000, SEED, **confirm_settings())
    assert sum(n for status, n in outcome.statuses.items() if 400 <= status < 500) > 6000


@pytest.mark.duration(5)
async def test_fuzz_every_route_with_the_oidc_verifier(deploy_with: Deploy, caplog: pytest.LogCaptureFixture) -> None:
    async with serve_idp(LoopbackIdP()) as idp:
        routes = ["oidc_callback", "oidc_callback", "connect", "callback", "api", "any"]
        await run_fuzz(
            deploy_with,
            caplog,
            routes,
            2000,
            SEED + 1,
            CONNECTOR_IDENTITY__VERIFIER="oidc",
            CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL=idp.discovery_url,
            CONNECTOR_IDENTITY__OIDC__CLIENT_ID=idp.client_id,
        )


def confirm_settings() -> dict[str, str]:
    return {
        "CONNECTOR_IDENTITY__VERIFIER": "confirm",
        "CONNECTOR_IDENTITY__CONFIRM__OPERATOR_URL": "http://127.0.0.1:9/operator/confirm",
        "CONNECTOR_IDENTITY__CONFIRM__ISSUER": ALICE.issuer,
        "CONNECTOR_IDENTITY__CONFIRM__API_KEY_HASHES": hashlib.sha256(OPERATOR_KEY.encode()).hexdigest(),
    }
