"""What the scripted client sees on the wire and checks there: the capabilities it sends, the transcript it keeps,
and the rules an agent can be seen to break (`WireObserver`, the part of `ScriptedClient` its transports call)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from service.core.urls import is_loopback_host
from service.util.hosts import assess_host

from .records import Elicitation, IgnoredMessage, StateUpdate, Violation, WireMessage

__all__ = [
    "CANCEL_REQUEST",
    "FORM_AND_URL",
    "FORM_ONLY",
    "INVALID_PARAMS",
    "NO_ELICITATION",
    "OMITTED",
    "REQUEST_CANCELLED",
    "URL_ONLY",
    "WireObserver",
]

REQUEST_CANCELLED: Final = -32800
INVALID_PARAMS: Final = -32602
CANCEL_REQUEST: Final = "$/cancel_request"


class _Omitted:
    def __repr__(self) -> str:
        return "OMITTED"


OMITTED: Final = _Omitted()
"""Pass as `capabilities` to leave the capabilities field out of `initialize` entirely."""

# Ready-made capability objects, exactly as they go on the wire.
URL_ONLY: Final[Mapping[str, Any]] = {"elicitation": {"url": {}}}
FORM_ONLY: Final[Mapping[str, Any]] = {"elicitation": {"form": {}}}
FORM_AND_URL: Final[Mapping[str, Any]] = {"elicitation": {"form": {}, "url": {}}}
NO_ELICITATION: Final[Mapping[str, Any]] = {}


class WireObserver:
    """Records every message in both directions, sets the capabilities on `initialize`, learns the sessions, serves
    `$/cancel_request`, and flags what the agent does wrong (`violations`, `Elicitation.flags`)."""

    def __init__(
        self, capabilities: Mapping[str, Any] | _Omitted | None, capabilities_field: str, protocol_version: int
    ) -> None:
        self.capabilities = capabilities
        self.capabilities_field = capabilities_field
        self.protocol_version = protocol_version
        self.transcript: list[WireMessage] = []
        self.elicitations: list[Elicitation] = []
        self.violations: list[Violation] = []
        self.ignored: list[IgnoredMessage] = []
        self.state_updates: list[StateUpdate] = []
        self.sessions: set[str] = set()
        self._session_requests: set[Any] = set()

    def advertises(self, mode: str) -> bool:
        """Whether the client advertised `mode`: `elicitation` and the mode are present and non-null."""
        caps = self.capabilities
        if not isinstance(caps, Mapping):
            return False
        elicitation = caps.get("elicitation")
        return isinstance(elicitation, Mapping) and elicitation.get(mode) is not None

    def _violation(self, rule: str, detail: str, request_id: Any = None) -> None:
        self.violations.append(Violation(rule, detail, request_id))

    def _on_outgoing(self, message: dict[str, Any]) -> dict[str, Any]:
        method = message.get("method")
        if method == "initialize":
            params = dict(message.get("params") or {})
            params.pop("clientCapabilities", None)
            params.pop("capabilities", None)
            if not isinstance(self.capabilities, _Omitted):
                params[self.capabilities_field] = copy.deepcopy(self.capabilities)
            params["protocolVersion"] = self.protocol_version
            message = {**message, "params": params}
        elif method in ("session/new", "session/load", "session/resume", "session/fork"):
            self._session_requests.add(message.get("id"))
            request = message.get("params")
            if method == "session/load" and isinstance(request, dict) and isinstance(request.get("sessionId"), str):
                self.sessions.add(request["sessionId"])
        elif method is None and "id" in message:
            for record in self.elicitations:
                if record.request_id == message["id"] and record.response is None:
                    if record.answer is not None and record.answer.raw_message is not None:
                        message = record.answer.raw_message(record.request_id)
                    record.response = message
                    record.answered.set()
                    break
        self.transcript.append(WireMessage("out", copy.deepcopy(message)))
        return message

    def _on_incoming(self, message: dict[str, Any]) -> bool:
        """Record a message from the agent; True when the client consumed it (the SDK must not see it)."""
        self.transcript.append(WireMessage("in", copy.deepcopy(message)))
        method = message.get("method")
        params = message.get("params")
        if method is None:
            if message.get("id") in self._session_requests and isinstance(message.get("result"), dict):
                self._session_requests.discard(message.get("id"))
                session_id = message["result"].get("sessionId")
                if isinstance(session_id, str):
                    self.sessions.add(session_id)
            return False
        if method == "elicitation/create" and "id" in message and isinstance(params, dict):
            self._received_elicitation(message["id"], params)
            return False
        if method == CANCEL_REQUEST and "id" not in message:
            self._received_cancel(params)
            return True
        if (
            method == "session/update"
            and isinstance(params, dict)
            and isinstance(params.get("update"), dict)
            and params["update"].get("sessionUpdate") == "state_update"
        ):
            update = params["update"]
            state = update.get("state")
            self.state_updates.append(
                StateUpdate(str(params.get("sessionId")), state if isinstance(state, str) else None, update)
            )
            return True
        return False

    def _received_elicitation(self, request_id: Any, params: dict[str, Any]) -> None:
        mode = params.get("mode")
        record = Elicitation(
            request_id=request_id,
            raw_params=copy.deepcopy(params),
            advertised=isinstance(mode, str) and self.advertises(mode),
        )
        if not record.advertised:
            record.flags.append("mode_not_advertised")
            self._violation("mode_not_advertised", f"the agent requested mode {mode!r}", request_id)
        session_id = params.get("sessionId")
        if isinstance(session_id, str) and session_id not in self.sessions:
            record.flags.append("unknown_session")
            self._violation("unknown_session", "sessionId names no session of this connection", request_id)
        if mode == "url":
            self._check_url(record, params.get("url"))
            elicitation_id = record.elicitation_id
            if elicitation_id is not None and any(
                e.mode == "url" and e.elicitation_id == elicitation_id and e.outstanding for e in self.elicitations
            ):
                record.flags.append("duplicate_elicitation_id")
                self._violation(
                    "duplicate_elicitation_id", "elicitationId reused while another is outstanding", request_id
                )
        self.elicitations.append(record)

    def _check_url(self, record: Elicitation, url: Any) -> None:
        if not isinstance(url, str):
            record.flags.append("no_url")
            self._violation("no_url", "a URL-mode request without a url", record.request_id)
            return
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
        except ValueError:
            record.flags.append("invalid_url")
            self._violation("invalid_url", "the url does not parse", record.request_id)
            return
        if parts.scheme not in ("http", "https") or not host:
            record.flags.append("invalid_url")
            self._violation("invalid_url", "the url is not an absolute http(s) URL", record.request_id)
            return
        if parts.username is not None or parts.password is not None:
            record.flags.append("credentials_in_url")
            self._violation("credentials_in_url", "the url carries user credentials", record.request_id)
        if parts.scheme != "https" and not is_loopback_host(host):
            record.flags.append("not_https")
        record.host = assess_host(host)
        if record.host.punycode:
            record.flags.append("punycode_host")
        if record.host.mixed_script:
            record.flags.append("mixed_script_host")

    def _received_cancel(self, params: Any) -> None:
        request_id = params.get("requestId") if isinstance(params, Mapping) else None
        for record in reversed(self.elicitations):  # ids may be reused once answered: the latest one counts
            if record.request_id == request_id:
                if record.response is not None or record.cancel_requested:
                    self.ignored.append(IgnoredMessage(CANCEL_REQUEST, request_id, "already_answered"))
                    return
                record.cancel_requested = True
                record._cancel.set()
                return
        self.ignored.append(IgnoredMessage(CANCEL_REQUEST, request_id, "unknown"))
