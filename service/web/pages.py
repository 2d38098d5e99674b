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
    def __init__(self, *, demo: bool = False) -> None:
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True), auto_reload=False
        )
        self.env.globals["demo"] = demo  # every page links back to the demo's start page

    def render(self, request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
        html = self.env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status_code)

    def message(
        self,
        request: Request,
        status_code: int,
        title: str,
        text: str,
        code: str | None = None,
        *,
        outcome: bool = False,
        request_id: str | None = None,
    ) -> HTMLResponse:
        """A page with one sentence. For a problem (`code`, not an `outcome`) it shows a reference to quote: the
        code and the request id the log lines carry (this request's, unless `request_id` names the one that failed)."""
        reference = None
        if code is not None and not outcome:
            request_id = request_id or request.scope.get("state", {}).get("request_id")
            reference = f"{code} · {request_id}" if request_id else code
        response = self.render(
            request, "message.html", {"title": title, "text": text, "reference": reference}, status_code
        )
        if code is not None:
            response.headers["X-Connector-Error"] = code
        return response

    def error(self, request: Request, exc: FlowRefused) -> HTMLResponse:
        refusal, text = describe(exc)
        return self.message(request, refusal.status, refusal.title, text, exc.code, outcome=refusal.outcome)
