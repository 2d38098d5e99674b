"""Logging setup: readable text by default, or one JSON object per line, through structlog.

The code logs with the standard library (`logging.getLogger(...)`); structlog's `ProcessorFormatter` renders every
record, ours and the libraries' (uvicorn's access log included), with the same fields: `time`, `level`, `logger`,
`message`, the record's `extra` values, and the context bound with `bound(...)` (e.g. `request_id` for every line
logged while a request is served).

Log fields may carry text from outside (a path, a provider's error description). In JSON it is escaped by the
encoder; in text every control character (and Unicode line separators and bidi overrides) is written as an escape
sequence by `escape_control_characters`, so one record is always one line and cannot forge another.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TextIO

# structlog is imported when the first line is written (`_FormatOnFirstUse`), not at start: a command that logs
# nothing (`grants list`) does without the import, about a tenth of its CPU.
if TYPE_CHECKING:
    from structlog.typing import EventDict, Processor, WrappedLogger

LogFormat = Literal["text", "json"]

# C0 and C1 controls, DEL, line and paragraph separators, and the bidirectional formatting characters.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape_control_characters_in(value: Any) -> Any:
    """`value` with every unsafe character of every string in it written as a Python escape (`\\n`, `\\x1b`)."""
    if isinstance(value, str):
        return _UNSAFE.sub(_escape, value) if _UNSAFE.search(value) else value
    if isinstance(value, Mapping):
        return {escape_control_characters_in(k): escape_control_characters_in(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [escape_control_characters_in(item) for item in value]
    return value


def escape_control_characters(logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
    """structlog processor: escape unsafe characters in every field (the text renderer writes strings as they are)."""
    return {key: escape_control_characters_in(value) for key, value in event_dict.items()}


def _uvicorn_fields(logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
    """uvicorn's access log line as fields: client, method, path, http_version, status (from its format args)."""
    args = event_dict.pop("positional_args", None)
    event_dict.pop("color_message", None)  # uvicorn's terminal-coloured copy of the message
    record = event_dict.get("_record")
    if isinstance(record, logging.LogRecord) and record.name == "uvicorn.access":
        if isinstance(args, tuple) and len(args) == 5:
            client, method, path, http_version, status = args
            event_dict.update(client=client, method=method, path=path, http_version=http_version, status=status)
    return event_dict


def _shared_processors() -> list[Processor]:
    import structlog

    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.ExtraAdder(),
        _uvicorn_fields,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
    ]


def formatter(log_format: LogFormat) -> logging.Formatter:
    """The formatter of every log line in `log_format`."""
    import structlog

    renderer: list[Processor]
    if log_format == "json":
        renderer = [
            structlog.processors.format_exc_info,  # the traceback as a string field, so the record stays one line
            structlog.processors.EventRenamer("message"),
            structlog.processors.JSONRenderer(sort_keys=False),
        ]
    else:
        renderer = [escape_control_characters, structlog.dev.ConsoleRenderer(colors=False, timestamp_key="time")]
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        pass_foreign_args=True,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )


class _FormatOnFirstUse(logging.Formatter):
    """`formatter(log_format)`, built when the first record is formatted."""

    def __init__(self, log_format: LogFormat) -> None:
        super().__init__()
        self._log_format: LogFormat = log_format
        self._formatter: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._formatter is None:
            self._formatter = formatter(self._log_format)
        return self._formatter.format(record)


def configure(
    log_format: str = "text", level: int = logging.INFO, *, debug: bool = False, stream: TextIO | None = None
) -> None:
    """Send every log record of the process to `stream` (stderr) in `log_format` ("text" or "json")."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_FormatOnFirstUse("json" if log_format == "json" else "text"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else level)
    # Python warnings become records too, not bare lines on stderr (off first: on again re-installs the hook if
    # something restored warnings.showwarning since).
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    # httpx logs every request URL at INFO: a credential entry injected as a query parameter (Pipedrive's api_token)
    # puts a key in the URL it calls, so these lines are never written.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # readiness checks would log on every probe
    # uvicorn's own loggers write through ours (no handlers or level of their own: a uvicorn.Config made with its
    # default log_config elsewhere in the process sets both, and would silence the access log).
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).setLevel(logging.NOTSET)
        logging.getLogger(name).propagate = True


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add `fields` to every log line written in this context (this task and the tasks it starts)."""
    from structlog.contextvars import bound_contextvars

    with bound_contextvars(**fields):
        yield


def bind(**fields: Any) -> None:
    """Add `fields` to the current context's log lines until it ends (e.g. a response's duration)."""
    from structlog.contextvars import bind_contextvars

    bind_contextvars(**fields)


def context() -> MutableMapping[str, Any]:
    """The fields bound to the current context."""
    from structlog.contextvars import get_contextvars

    return get_contextvars()
