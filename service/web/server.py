"""Running the ASGI app under uvicorn. Its access log is off: query strings carry codes and state.

Our own middleware logs method, path and status instead. In case some logging setup turns uvicorn's
access log back on, a filter on its logger strips query strings from every line it would write.
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn


class _StripQuery(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def _quiet_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _StripQuery) for f in access.filters):
        access.addFilter(_StripQuery())
    access.disabled = True


def make_server(app: Any, host: str, port: int) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_config=None,  # keep the process's logging setup
        proxy_headers=False,
        server_header=False,
        lifespan="off",
    )
    _quiet_access_log()
    return uvicorn.Server(config)


async def serve(app: Any, host: str, port: int) -> None:
    await make_server(app, host, port).serve()
