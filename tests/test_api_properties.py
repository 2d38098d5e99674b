"""A property-based run over `/v1/openapi.json` (schemathesis + Hypothesis), on SQLite and PostgreSQL.

Every operation the document describes is called with a valid API key and generated inputs: valid ones (which
the document allows) and invalid ones (which it forbids). Each answer must be below 500, have a status, a
content type, headers and a body the document declares for that operation, and the log must hold no traceback and
no ERROR line. The run is derandomized: the same inputs on every run, so a failure reproduces.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .api_support import api_client, create_body, make_key
from .conftest import Deploy
from .test_http_fuzz import problems_in_log

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 20  # per operation and generation mode


def explore(document: dict[str, Any], base_url: str, key: str) -> list[str]:
    """Call every operation of `document` with generated inputs; the operations called (in a worker thread: the
    server runs on the test's event loop)."""
    schema = schemathesis.openapi.from_dict(document)
    called: list[str] = []
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {key}"
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                run_operation(operation.as_strategy(generation_mode=mode), session, base_url)
            called.append(f"{operation.method.upper()} {operation.path}")
    return called


def run_operation(strategy: Any, session: requests.Session, base_url: str) -> None:
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: the first failure is reported as it was
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        if case.operation.path == "/v1/events":
            check_stream(case, session, base_url)
            return
        response = case.call(base_url=base_url, session=session, timeout=30)
        case.validate_response(response, checks=CHECKS)

    check()


def check_stream(case: schemathesis.Case, session: requests.Session, base_url: str) -> None:
    """The event stream never ends by itself: an opened one is checked by its status and content type and closed;
    a refused one like any other answer."""
    sent = case.as_transport_kwargs(base_url=base_url, headers=dict(session.headers))
    with session.request(**sent, timeout=30, stream=True) as response:
        if response.status_code == 200:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert "200" in case.operation.definition.raw["responses"]
            return
        response.content  # noqa: B018 - read the finite body before validating it
        case.validate_response(response, checks=CHECKS)


@pytest.mark.duration(40)
async def test_every_operation_answers_as_documented(
    deploy_with: Deploy, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        store = deployment.connector.runtime.store
        key = await make_key(store)
        async with api_client(deployment.base_url, key) as api:
            document = (await api.get("/v1/openapi.json")).json()
            # a real elicitation, so some generated ids and bodies meet a row
            assert (await api.post("/v1/elicitations", json=create_body(deployment.local_user))).status_code == 201
        caplog.clear()
        run: Callable[[], list[str]] = lambda: explore(document, deployment.base_url, key)  # noqa: E731
        called = await asyncio.to_thread(run)
        records = list(caplog.records)
    documented = {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}
    assert set(called) == documented
    assert problems_in_log(records) == []
