"""The OpenAPI 3.1 document of `/v1`, generated from the operations and the pydantic models the handlers use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..errors import refusal_of
from . import models
from .routes import Operation

REF = "#/components/schemas/{model}"
INPUT_LAYER_ERROR = "invalid_input"


def openapi_document(operations: Sequence[Operation], *, version: str, server_url: str) -> dict[str, Any]:
    used: list[type[BaseModel]] = [models.Error]
    for op in operations:
        if op.body is not None:
            used.append(op.body)
        used.extend(model for model in op.responses.values() if model is not None)
        if op.stream_model is not None:
            used.append(op.stream_model)
    unique = list(dict.fromkeys(used))
    _, top = models_json_schema(
        [(model, "validation" if _is_request(model, operations) else "serialization") for model in unique],
        ref_template=REF,
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ACP OAuth connector: agent API",
            "version": version,
            "description": (
                "The sidecar API for ACP agents in any language: create URL-mode elicitations, report the "
                "client's answer, learn outcomes, list and revoke grants, and call providers' APIs through a "
                "proxy that injects the user's token. Tokens never leave the connector."
            ),
        },
        "servers": [{"url": server_url}],
        "security": [{"apiKey": []}],
        "paths": paths,
        "components": {
            "schemas": top.get("$defs", {}),
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key from `acp-connector api-keys create`.",
                }
            },
        },
    }


def _is_request(model: type[BaseModel], operations: Sequence[Operation]) -> bool:
    return any(op.body is model for op in operations)


def _operation(op: Operation) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "summary": op.summary,
        "operationId": f"{op.method.lower()}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
        "responses": {},
    }
    if op.params:
        doc["parameters"] = [
            {"name": p.name, "in": p.where, "required": p.required, "description": p.description, "schema": p.schema}
            for p in op.params
        ]
    if op.body is not None:
        doc["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=op.body.__name__)}}},
        }
    for status, model in sorted(op.responses.items()):
        if model is None:
            doc["responses"][str(status)] = {"description": "Done; no body."}
        else:
            doc["responses"][str(status)] = {
                "description": model.__doc__.strip().splitlines()[0] if model.__doc__ else model.__name__,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
            }
    if op.streaming is not None:
        media: dict[str, Any] = {}
        if op.stream_model is not None:
            # OpenAPI 3.1 has no item schema for streams (3.2 adds itemSchema): an extension names it.
            media = {"x-item-schema": {"$ref": REF.format(model=op.stream_model.__name__)}}
        doc["responses"]["200"] = {"description": "A stream.", "content": {op.streaming: media}}
    by_status: dict[int, list[str]] = {}
    # Every request passes the input layer first (web/inputs.py): any operation may answer `invalid_input`.
    for code in dict.fromkeys((*op.errors, INPUT_LAYER_ERROR)):
        by_status.setdefault(refusal_of(code).status, []).append(code)
    for status, codes in sorted(by_status.items()):
        doc["responses"][str(status)] = {
            "description": "Error codes: " + ", ".join(f"`{c}`" for c in codes),
            "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
        }
    return doc
