"""The TypeScript package (`clients/typescript`): its copy of `/v1/openapi.json`, from which its types are generated,
is the document the service serves. (The package's own tests, lint and type check run by `npm test` / `npm run lint`
from `make test`.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .api_support import api_client
from .conftest import Deployment

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"
SNAPSHOT = PACKAGE / "openapi.json"
UPDATE = "CONNECTOR_UPDATE_OPENAPI"  # =1: write the served document to the snapshot (then `npm run generate`)


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The document without what depends on the deployment (its URL) or the release (its version)."""
    return {**document, "servers": [], "info": {**document["info"], "version": ""}}


async def test_the_packages_openapi_copy_is_the_served_document(deployment: Deployment) -> None:
    async with api_client(deployment.base_url, None) as api:
        served = comparable((await api.get("/v1/openapi.json")).json())
    if os.environ.get(UPDATE) == "1":
        SNAPSHOT.write_text(json.dumps(served, indent=2, sort_keys=True) + "\n")
    assert json.loads(SNAPSHOT.read_text()) == served, (
        f"{SNAPSHOT} is not what /v1/openapi.json serves: run `{UPDATE}=1 pytest {Path(__file__).name}`, "
        "then `npm run generate` in clients/typescript, and adapt the package to the change"
    )
