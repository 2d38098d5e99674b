"""Reading and answering `/v1` requests: the caller's key, bodies validated against the models, JSON answers."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from service.core.agent_api import AgentApi
from service.core.errors import FlowRefused
from service.core.records import ApiKeyRecord

M = TypeVar("M", bound=BaseModel)


async def caller(request: Request, api: AgentApi) -> ApiKeyRecord:
    """The API key of `Authorization: Bearer <key>`; FlowRefused `unauthorized` when it is missing or not live."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return await api.authenticate(key.strip() if scheme.lower() == "bearer" else None)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused (413 `body_too_large`) as soon as it passes `limit` bytes; never spooled."""
    too_big = FlowRefused("body_too_large", detail={"limit": str(limit)})
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def read_model(request: Request, model: type[M], limit: int) -> M:
    """The body as `model`: 400 `invalid_json` when it is not a JSON object, `invalid_request` naming the first
    problem (an unknown field, a missing one, a wrong type) when it does not fit."""
    raw = await read_body(request, limit)
    try:
        data = json.loads(raw)
    except ValueError:
        raise FlowRefused("invalid_json") from None
    if not isinstance(data, dict):
        raise FlowRefused("invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FlowRefused("invalid_request", detail={"problem": problem(exc)}) from None


def problem(exc: ValidationError) -> str:
    """The first validation problem, naming the field but never echoing the value."""
    error = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "body"
    if error["type"] == "extra_forbidden":
        return f"unknown field '{where}'"
    if error["type"] == "missing":
        return f"'{where}' is required"
    return f"'{where}': {error['msg'].removeprefix('Value error, ')}"


def answer(body: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json", by_alias=True), status, headers=headers)


def query_text(request: Request, name: str, *, required: bool = False, max_length: int = 512) -> str | None:
    """A query parameter of printable text, bounded; 400 `invalid_request` otherwise."""
    values = request.query_params.getlist(name)
    if not values:
        if required:
            raise FlowRefused("invalid_request", detail={"problem": f"'{name}' is required"})
        return None
    value = values[0]
    if len(values) > 1 or not value or len(value) > max_length or not value.isprintable():
        raise FlowRefused("invalid_request", detail={"problem": f"'{name}' must be given once, as printable text"})
    return value


def as_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
