"""The connector's public JWKS (`/.well-known/jwks.json`): the keys a provider verifies our `private_key_jwt`
client assertions with. Public halves only, one per vault key (the active one first), so a vault key rotation
overlaps: the old key stays published until it is retired."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..oauth import ClientKeys
from ..oauth.client_keys import JWKS_PATH
from ..vault import Vault

# Providers cache a client's JWKS; five minutes keeps a rotation's new key visible soon after it is rolled out.
MAX_AGE = 300


def jwks_route(vault: Vault) -> Route:
    keys = ClientKeys(vault)

    async def endpoint(request: Request) -> Response:
        return JSONResponse(
            keys.jwks(),
            media_type="application/jwk-set+json",
            headers={"Cache-Control": f"public, max-age={MAX_AGE}"},
        )

    return Route(JWKS_PATH, endpoint, methods=["GET"])
