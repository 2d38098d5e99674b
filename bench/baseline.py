"""The baseline: a minimal OAuth app on authlib + Starlette doing the provider round trips a connect flow does.

`GET /login` sends the browser to the provider's authorize endpoint (state and a PKCE S256 verifier kept server
side, bound to the browser by a cookie); `GET /callback` checks the state and the cookie, redeems the code at the
token endpoint, reads the account from the userinfo endpoint and keeps the token in memory. One long-lived
authlib `AsyncOAuth2Client` (one httpx connection pool) serves every request, as a well-written app would.

What the app built to start is frozen out of the garbage collector's walks before it serves, as the benchmark
agent's start is (bench/agent.py; BENCH_GC_FREEZE=0: neither).

    python -m bench.baseline PORT PROVIDER_BASE_URL CLIENT_ID CLIENT_SECRET   (started by bench/flow.py)
"""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import sys
import warnings

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from bench.harness import serve_on_loopback

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # authlib 1.9 nudges towards the httpx2 fork
    from authlib.common.security import generate_token
    from authlib.integrations.httpx_client import AsyncOAuth2Client


def build_app(provider: str, client_id: str, client_secret: str, redirect_uri: str) -> Starlette:
    client = AsyncOAuth2Client(
        client_id, client_secret, redirect_uri=redirect_uri, code_challenge_method="S256", timeout=15.0
    )
    pending: dict[str, tuple[str, str]] = {}  # state -> (browser cookie, PKCE verifier)
    tokens: dict[str, dict[str, object]] = {}  # provider account id -> token

    async def login(request: Request) -> Response:
        browser = request.cookies.get("b") or secrets.token_urlsafe(16)
        verifier = generate_token(48)
        url, state = client.create_authorization_url(f"{provider}/authorize", code_verifier=verifier, scope="repo")
        pending[state] = (browser, verifier)
        response = RedirectResponse(url, status_code=302)
        response.set_cookie("b", browser, httponly=True, samesite="lax")
        return response

    async def callback(request: Request) -> Response:
        state = request.query_params.get("state", "")
        entry = pending.pop(state, None)
        if entry is None or request.cookies.get("b") != entry[0]:
            return PlainTextResponse("unknown state", status_code=400)
        token = await client.fetch_token(
            f"{provider}/token",
            code=request.query_params.get("code", ""),
            code_verifier=entry[1],
            state=state,
            redirect_uri=redirect_uri,
        )
        account = await client.request(
            "GET",
            f"{provider}/api/user",
            headers={"Authorization": f"Bearer {token['access_token']}"},
            withhold_token=True,  # this client is shared: the token is per user, not the client's
        )
        account.raise_for_status()
        tokens[str(account.json()["id"])] = dict(token)
        return HTMLResponse("<p>Connected. You can close this tab.</p>")

    return Starlette(routes=[Route("/login", login), Route("/callback", callback)])


async def main(port: int, provider: str, client_id: str, client_secret: str) -> None:
    app = build_app(provider, client_id, client_secret, f"http://127.0.0.1:{port}/callback")
    if os.environ.get("BENCH_GC_FREEZE", "1") != "0":  # tuned as the benchmark agent is (bench/agent.py)
        gc.collect()
        gc.freeze()
    await serve_on_loopback(app, port)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]))
