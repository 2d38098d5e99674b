"""An OAuth flow's row as stored: for the flow repository, and for a change that inserts the flow it starts."""

from __future__ import annotations

from typing import Any

from service.core.records import FlowRecord


def flow_row(rec: FlowRecord) -> dict[str, Any]:
    """The oauth_flows row of `rec` (also for a repository that inserts it with another change)."""
    return {
        "id": rec.id,
        "elicitation_id": rec.elicitation_id,
        "state_hash": rec.state_hash,
        "verifier_key_id": rec.verifier_key_id,
        "verifier_ciphertext": rec.verifier_ciphertext,
        "nonce": rec.nonce,
        "expected_issuer": rec.expected_issuer,
        "browser_binding_hash": rec.browser_binding_hash,
        "redirect_uri": rec.redirect_uri,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "used_at": rec.used_at,
    }
