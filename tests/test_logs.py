"""Log lines as operators read them: JSON mode is JSON on every line (uvicorn's access log included), a request id
on every line a request causes, and text mode keeps one record on one line whatever a field holds."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import httpx
import pytest

from service.logs import configure
from service.testing import ScriptedBrowser

from .conftest import Deployment
from .identity_support import logging_restored

HOSTILE = "line one\nFAKE 2026-01-01 [error] forged\r\x1b[31mred\x1b[0m \u202eevil\u2028sep\x00nul\x7f"


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    with logging_restored():
        yield stream


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    lines = stream.getvalue().splitlines()
    assert lines, "nothing was logged"
    return [json.loads(line) for line in lines]  # every line parses, or the test fails here


def test_json_mode_writes_one_object_per_record_with_fields(log_stream: io.StringIO) -> None:
    configure("json", stream=log_stream)
    logging.getLogger("service.test").warning("provider said %s", HOSTILE, extra={"provider": "github"})
    (record,) = json_lines(log_stream)
    assert record["message"] == f"provider said {HOSTILE}"  # escaped by the encoder, the original after decoding
    assert record["level"] == "warning" and record["logger"] == "service.test" and record["provider"] == "github"
    assert str(record["time"]).endswith("Z")


def test_text_mode_escapes_control_characters_in_every_field(log_stream: io.StringIO) -> None:
    configure("text", stream=log_stream)
    logging.getLogger("service.test").warning(
        "provider said %s", HOSTILE, extra={"detail": HOSTILE, "nested": {"why": HOSTILE}}
    )
    (line,) = log_stream.getvalue().splitlines()  # one record, one line: nothing forged a second one
    for raw in ("\r", "\x1b", "\u202e", "\u2028", "\x00", "\x7f"):
        assert raw not in line
    assert "line one\\nFAKE" in line and "\\x1b[31mred" in line and "\\u202eevil" in line


def test_exceptions_stay_on_one_json_line(log_stream: io.StringIO) -> None:
    configure("json", stream=log_stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("service.test").exception("it failed")
    (record,) = json_lines(log_stream)
    assert "RuntimeError: boom" in str(record["exception"])


def test_python_warnings_become_json_records(log_stream: io.StringIO) -> None:
    configure("json", stream=log_stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("something is deprecated", DeprecationWarning, stacklevel=1)
    logging.captureWarnings(False)
    (record,) = json_lines(log_stream)
    assert record["logger"] == "py.warnings" and "something is deprecated" in str(record["message"])


async def test_every_line_of_a_request_carries_its_id_and_the_access_log_is_structured(
    deployment: Deployment, log_stream: io.StringIO
) -> None:
    configure("json", stream=log_stream)
    async with ScriptedBrowser() as browser:
        # A query string that must not be logged.
        answer = await browser.get(f"{deployment.base_url}/connect/no-such-link?code=secret-code-value")
    assert answer.status_code == 404
    request_id = answer.headers["x-request-id"]
    records = json_lines(log_stream)
    access = [r for r in records if r["logger"] == "uvicorn.access"]
    assert len(access) == 1
    (line,) = access
    assert line["request_id"] == request_id and line["method"] == "GET" and line["status"] == 404
    assert line["path"] == "/connect/no-such-link" and isinstance(line["duration_ms"], float)
    assert "secret-code-value" not in log_stream.getvalue()
    # Every line written while the request was served has its id (the audit or refusal lines, if any, too).
    during = [r for r in records if r.get("request_id") is not None]
    assert during and all(r["request_id"] == request_id for r in during)


async def test_requests_get_distinct_ids(deployment: Deployment) -> None:
    async with httpx.AsyncClient() as http:
        ids = {(await http.get(f"{deployment.base_url}/healthz")).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3
