"""Whether a client advertised URL-mode elicitation: only an explicit, non-null `url` object counts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from acp.schema import ClientCapabilities


def url_mode_advertised(capabilities: ClientCapabilities | Mapping[str, Any] | None) -> bool:
    """True only when the client advertised URL-mode elicitation with an explicit, non-null `url` object.

    Accepts the SDK's `ClientCapabilities` model or the raw JSON object (`clientCapabilities` in ACP v1,
    `capabilities` in v2). An omitted or null `elicitation`, `{}`, and `{"url": null}` advertise nothing.
    """
    if capabilities is None:
        return False
    if isinstance(capabilities, ClientCapabilities):
        elicitation = capabilities.elicitation
        return elicitation is not None and elicitation.url is not None
    raw = capabilities.get("elicitation")
    if not isinstance(raw, Mapping):
        return False
    return isinstance(raw.get("url"), Mapping)
