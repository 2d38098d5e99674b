"""Which elicitation modes an MCP client advertised, by MCP's rules (not ACP's).

MCP (2025-11-25 and 2026-07-28): `"elicitation": {"form": {}, "url": {}}` names each mode; for backwards
compatibility an empty `"elicitation": {}` means form mode only. ACP requires every mode to be explicit, so there
`{}` advertises nothing; the two agree only that URL mode needs an explicit `url` object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_types import ClientCapabilities

FORM = "form"
URL = "url"


def advertised_modes(capabilities: ClientCapabilities | Mapping[str, Any] | None) -> frozenset[str]:
    """The elicitation modes the client advertised (the SDK's model or the raw `capabilities` JSON object).

    No or a null `elicitation`: none. `{}`: form only (MCP's compatibility rule). Otherwise each mode whose value is
    an object; a null or non-object value advertises nothing.
    """
    if capabilities is None:
        return frozenset()
    if isinstance(capabilities, ClientCapabilities):
        raw: object = (
            None if capabilities.elicitation is None else capabilities.elicitation.model_dump(exclude_none=True)
        )
    else:
        raw = capabilities.get("elicitation")
    if not isinstance(raw, Mapping):
        return frozenset()
    if not raw:
        return frozenset({FORM})
    return frozenset(mode for mode in (FORM, URL) if isinstance(raw.get(mode), Mapping))


def url_mode_advertised(capabilities: ClientCapabilities | Mapping[str, Any] | None) -> bool:
    """True only when the client advertised URL-mode elicitation with an explicit `url` object."""
    return URL in advertised_modes(capabilities)
