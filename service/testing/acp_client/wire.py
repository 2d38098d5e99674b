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
SESSION_REQUESTS: Final = ("session/new", "session/load", "session/resume", "session/fork")


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

    def _flag(self, record: Elicitation, rule: str, detail: str | None = None) -> None:
        """Flag `record`; with `detail`, the agent broke a rule: a violation too."""
        record.flags.append(rule)
        if detail is not None:
            self._violation(rule, detail, record.request_id)

    # -- client -> agent -----------------------------------------------------------------------------------
    def _on_outgoing(self, message: dict[str, Any]) -> dict[str, Any]:
        """Record a message to the agent, after setting what the script decides (capabilities, a raw answer)."""
        method = message.get("method")
        if method == "initialize":
            message = self._initialize(message)
        elif method in SESSION_REQUESTS:
            self._session_request(method, message)
        elif method is None and "id" in message:
            message = self._response(message)
        self.transcript.append(WireMessage("out", copy.deepcopy(message)))
        return message

    def _initialize(self, message: dict[str, Any]) -> dict[str, Any]:
        """`initialize` with the protocol version and the capabilities exactly as configured."""
        params = dict(message.get("params") or {})
        params.pop("clientCapabilities", None)
        params.pop("capabilities", None)
        if not isinstance(self.capabilities, _Omitted):
            params[self.capabilities_field] = copy.deepcopy(self.capabilities)
        params["protocolVersion"] = self.protocol_version
        return {**message, "params": params}

    def _session_request(self, method: str, message: dict[str, Any]) -> None:
        """Remember the request, to learn the session id from its response (`session/load` names it already)."""
        self._session_requests.add(message.get("id"))
        request = message.get("params")
        if method == "session/load" and isinstance(request, dict) and isinstance(request.get("sessionId"), str):
            self.sessions.add(request["sessionId"])

    def _response(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to an `elicitation/create` (replaced by a scripted raw message), recorded on its elicitation."""
        for record in self.elicitations:
            if record.request_id == message["id"] and record.response is None:
                if record.answer is not None and record.answer.raw_message is not None:
                    message = record.answer.raw_message(record.request_id)
                record.response = message
                record.answered.set()
                break
        return message

    # -- agent -> client -----------------------------------------------------------------------------------
    def _on_incoming(self, message: dict[str, Any]) -> bool:
        """Record a message from the agent; True when the client consumed it (the SDK must not see it)."""
        self.transcript.append(WireMessage("in", copy.deepcopy(message)))
        method = message.get("method")
        params = message.get("params")
        if method is None:
            self._session_response(message)
            return False
        if method == "elicitation/create" and "id" in message and isinstance(params, dict):
            self._received_elicitation(message["id"], params)
            return False
        if method == CANCEL_REQUEST and "id" not in message:
            self._received_cancel(params)
            return True
        if method == "session/update" and isinstance(params, dict):
            return self._received_state_update(params)
        return False

    def _session_response(self, message: dict[str, Any]) -> None:
        result = message.get("result")
        if message.get("id") in self._session_requests and isinstance(result, dict):
            self._session_requests.discard(message.get("id"))
            session_id = result.get("sessionId")
            if isinstance(session_id, str):
                self.sessions.add(session_id)

    def _received_state_update(self, params: dict[str, Any]) -> bool:
        """An ACP v2 `state_update` (which the SDK has no model for) is consumed here; True when it was one."""
        update = params.get("update")
        if not isinstance(update, dict) or update.get("sessionUpdate") != "state_update":
            return False
        state = update.get("state")
        self.state_updates.append(
            StateUpdate(str(params.get("sessionId")), state if isinstance(state, str) else None, update)
        )
        return True

    def _received_elicitation(self, request_id: Any, params: dict[str, Any]) -> None:
        mode = params.get("mode")
        record = Elicitation(
            request_id=request_id,
            raw_params=copy.deepcopy(params),
            advertised=isinstance(mode, str) and self.advertises(mode),
        )
        if not record.advertised:
            self._flag(record, "mode_not_advertised", f"the agent requested mode {mode!r}")
        session_id = params.get("sessionId")
        if isinstance(session_id, str) and session_id not in self.sessions:
            self._flag(record, "unknown_session", "sessionId names no session of this connection")
        if mode == "url":
            self._check_url(record, params.get("url"))
            elicitation_id = record.elicitation_id
            if elicitation_id is not None and any(
                e.mode == "url" and e.elicitation_id == elicitation_id and e.outstanding for e in self.elicitations
            ):
                self._flag(record, "duplicate_elicitation_id", "elicitationId reused while another is outstanding")
        self.elicitations.append(record)

    def _check_url(self, record: Elicitation, url: Any) -> None:
        if not isinstance(url, str):
            self._flag(record, "no_url", "a URL-mode request without a url")
            return
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
        except ValueError:
            self._flag(record, "invalid_url", "the url does not parse")
            return
        if parts.scheme not in ("http", "https") or not host:
            self._flag(record, "invalid_url", "the url is not an absolute http(s) URL")
            return
        if parts.username is not None or parts.password is not None:
            self._flag(record, "credentials_in_url", "the url carries user credentials")
        if parts.scheme != "https" and not is_loopback_host(host):
            self._flag(record, "not_https")
        record.host = assess_host(host)
        if record.host.punycode:
            self._flag(record, "punycode_host")
        if record.host.mixed_script:
            self._flag(record, "mixed_script_host")

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
