"""The console's pages (GET): overview, grants, elicitations, audit (and its CSV export), webhooks, keys. Each list
is one keyset page (`?after=` the cursor the previous page linked to); filters are query parameters."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ...config import AdminSettings
from ...console import AuditFilter, Console, GrantFilter
from ...core.health import GrantStatus
from ...core.paging import Page
from ..inputs import check_query, invalid
from ..pages import Pages
from .session import Caller, OperatorAuth

CSV_MAX_ROWS = 100_000  # one export; narrow the filters for more
CSV_BATCH = 1000
GRANT_STATUSES = ("", "needs_user", "failing")


def when(value: str | None, name: str) -> datetime | None:
    """A filter's time: an ISO date or date-time (without an offset: UTC)."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise invalid(f"the query parameter '{name}' must be a date or a date and time (ISO 8601)") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def audit_filter(query: Mapping[str, str]) -> AuditFilter:
    return AuditFilter(
        subject=query.get("user") or None,
        provider=query.get("provider") or None,
        event=query.get("event") or None,
        since=when(query.get("since"), "since"),
        until=when(query.get("until"), "until"),
    )


def grant_filter(query: Mapping[str, str]) -> GrantFilter:
    status = query.get("status", "")
    if status not in GRANT_STATUSES:
        raise invalid("the query parameter 'status' must be needs_user or failing")
    return GrantFilter(
        subject=query.get("user") or None,
        issuer=query.get("issuer") or None,
        provider=query.get("provider") or None,
        status=status or None,
        tenant=query.get("tenant") or None,
    )


def next_link(request: Request, page: Page[Any]) -> str | None:
    """The address of the page after `page` (its filters kept), or None on the last page."""
    if page.next is None:
        return None
    query = {k: v for k, v in request.query_params.items() if k != "after" and v}
    return f"{request.url.path}?{urlencode({**query, 'after': page.next})}"


class Views:
    def __init__(self, console: Console, pages: Pages, auth: OperatorAuth, settings: AdminSettings) -> None:
        self.console = console
        self.pages = pages
        self.auth = auth
        self.limit = settings.page_size
        self.oidc = settings.oidc

    def render(self, request: Request, caller: Caller, name: str, context: dict[str, Any]) -> Response:
        context = {
            "operator": caller.operator,
            "logout_csrf": self.auth.csrf_token(caller, "logout") if caller.operator.via == "oidc" else None,
            "query": dict(request.query_params.items()),
            **context,
        }
        return self.pages.render(request, f"admin/{name}.html", context)

    async def overview(self, request: Request, caller: Caller) -> Response:
        overview = await self.console.overview()
        providers = sorted(overview.grants.total)
        needs: dict[str, list[tuple[str, int]]] = {}
        for (provider, reason), count in sorted(overview.grants.needs_user.items()):
            needs.setdefault(provider, []).append((reason, count))
        rows = [(p, overview.grants.total[p], sum(n for _, n in needs.get(p, [])), needs.get(p, [])) for p in providers]
        return self.render(
            request,
            caller,
            "overview",
            {
                "title": "Overview",
                "rows": rows,
                "total": sum(overview.grants.total.values()),
                "failing": overview.grants.failing,
                "pending": [(s.value, n) for s, n in overview.pending.items()],
                "pending_total": sum(overview.pending.values()),
                "backlog": overview.webhook_backlog,
                "counted_at": overview.counted_at,
                "oldest": overview.webhook_oldest,
            },
        )

    async def grants(self, request: Request, caller: Caller) -> Response:
        query = check_query(request.scope.get("query_string", b""))
        page = await self.console.grants(grant_filter(query), query.get("after"), self.limit)
        now = datetime.now(UTC)
        rows = []
        for grant in page.items:
            status, reason = grant.status_at(now)
            rows.append(
                {
                    "grant": grant,
                    "status": status.value,
                    "reason": reason.value if reason is not None else None,
                    "attention": status is not GrantStatus.ACTIVE or grant.health.failures > 0,
                }
            )
        return self.render(
            request,
            caller,
            "grants",
            {"title": "Grants", "rows": rows, "next": next_link(request, page), "statuses": GRANT_STATUSES},
        )

    async def elicitations(self, request: Request, caller: Caller) -> Response:
        query = check_query(request.scope.get("query_string", b""))
        view = query.get("view", "pending")
        if view not in ("pending", "recent"):
            raise invalid("the query parameter 'view' must be pending or recent")
        page = await self.console.elicitations_page(
            pending=view == "pending", after=query.get("after"), limit=self.limit, subject=query.get("user") or None
        )
        return self.render(
            request,
            caller,
            "elicitations",
            {"title": "Elicitations", "rows": page.items, "view": view, "next": next_link(request, page)},
        )

    async def audit(self, request: Request, caller: Caller) -> Response:
        query = check_query(request.scope.get("query_string", b""))
        page = await self.console.audit(audit_filter(query), query.get("after"), self.limit)
        rows = [(record, json.dumps(record.detail, sort_keys=True)) for record in page.items]
        export = urlencode({k: v for k, v in query.items() if k != "after" and v})
        return self.render(
            request,
            caller,
            "audit",
            {"title": "Audit", "rows": rows, "next": next_link(request, page), "export": export},
        )

    async def audit_csv(self, request: Request, caller: Caller) -> Response:
        query = check_query(request.scope.get("query_string", b""))
        where = audit_filter(query)

        async def rows() -> AsyncIterator[str]:
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(["id", "at", "event", "elicitation_id", "issuer", "subject", "provider", "detail"])
            after, sent = query.get("after"), 0
            while sent < CSV_MAX_ROWS:
                page = await self.console.audit(where, after, min(CSV_BATCH, CSV_MAX_ROWS - sent))
                for r in page.items:
                    writer.writerow(
                        [
                            r.id,
                            r.at.isoformat(),
                            r.event,
                            r.elicitation_id or "",
                            r.identity.issuer if r.identity else "",
                            r.identity.subject if r.identity else "",
                            r.provider or "",
                            json.dumps(r.detail, sort_keys=True),
                        ]
                    )
                sent += len(page.items)
                yield out.getvalue()
                out.seek(0)
                out.truncate()
                if page.next is None:
                    return
                after = page.next

        return StreamingResponse(
            rows(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": 'attachment; filename="audit.csv"'},
        )

    async def webhooks(self, request: Request, caller: Caller) -> Response:
        query = check_query(request.scope.get("query_string", b""))
        page = await self.console.endpoints(query.get("after"), self.limit)
        return self.render(
            request, caller, "webhooks", {"title": "Webhooks", "rows": page.items, "next": next_link(request, page)}
        )

    async def deliveries(self, request: Request, caller: Caller) -> Response:
        query = check_query(request.scope.get("query_string", b""))
        endpoint = await self.console.endpoint(request.path_params["webhook_id"])
        page = await self.console.deliveries(endpoint.id, query.get("after"), self.limit)
        return self.render(
            request,
            caller,
            "deliveries",
            {
                "title": "Webhook deliveries",
                "endpoint": endpoint,
                "rows": page.items,
                "next": next_link(request, page),
                "previous_live": endpoint.previous_secret_live(datetime.now(UTC)),
            },
        )

    async def keys(self, request: Request, caller: Caller) -> Response:
        counted_at, rows = await self.console.keys()
        return self.render(request, caller, "keys", {"title": "Vault keys", "rows": rows, "counted_at": counted_at})
