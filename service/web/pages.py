"""Rendering pages with Jinja2 (autoescaped): the consent page and one template for every message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..core.errors import FlowRefused
from .errors import describe

TEMPLATES = Path(__file__).parent / "templates"


class Pages:
    def __init__(self) -> None:
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True), auto_reload=False
        )

    def render(self, request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
        html = self.env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status_code)

    def message(
        self, request: Request, status_code: int, title: str, text: str, code: str | None = None
    ) -> HTMLResponse:
        response = self.render(request, "message.html", {"title": title, "text": text, "code": code}, status_code)
        if code is not None:
            response.headers["X-Connector-Error"] = code
        return response

    def error(self, request: Request, exc: FlowRefused) -> HTMLResponse:
        refusal, text = describe(exc)
        return self.message(request, refusal.status, refusal.title, text, exc.code)
