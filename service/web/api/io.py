"""Reading and answering `/v1` requests: the caller's key, bodies validated against the models, JSON answers."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from service.core.agent_api import AgentApi
from service.core.identity import IDENTITY_PART_MAX, Identity
from service.core.records import ApiKeyRecord

from ..inputs import invalid, read_json_object

M = TypeVar("M", bound=BaseModel)


async def caller(request: Request, api: AgentApi) -> ApiKeyRecord:
    """The API key of `Authorization: Bearer <key>`; FlowRefused `unauthorized` when it is missing or not live."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return await api.authenticate(key.strip() if scheme.lower() == "bearer" else None)


async def read_model(request: Request, model: type[M], limit: int, *, optional: bool = False) -> M:
    """The body as `model`: read and checked by the input layer (`bad_request` when it is not a JSON object,
    `invalid_input` for control characters or deep nesting), then `invalid_input` naming the first problem
    (an unknown field, a missing one, a wrong type) when it does not fit the model."""
    data = await read_json_object(request, limit, empty_ok=optional)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid(problem(exc)) from None


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


def query_text(request: Request, name: str, *, required: bool = False) -> str | None:
    """A query parameter (the input layer has checked its length and characters and that it is given once)."""
    value = request.query_params.get(name)
    if value is None and required:
        raise invalid(f"the query parameter '{name}' is required")
    return value


def identity_of(issuer: str | None, subject: str | None, *, where: str) -> Identity:
    """The user named by `issuer` and `subject`; `invalid_input` (saying `where` to send them) when either is
    missing, empty, blank or longer than 512 characters, so no route ever builds an `Identity` that cannot be."""
    for value in (issuer, subject):
        if value is None or not value.strip() or len(value) > IDENTITY_PART_MAX:
            raise invalid(f"{where}: a non-empty issuer and subject of at most {IDENTITY_PART_MAX} characters each")
    assert issuer is not None and subject is not None
    return Identity(issuer, subject)
