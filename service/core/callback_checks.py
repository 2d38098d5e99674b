"""The provider callback's claim of its flow: in one statement with its checks, else the checks one by one.

`BrowserFlow.callback` first claims the flow with every check as a condition of one statement
(`claim_with_elicitation`). When that claims nothing, the checks run here in order, each refusal audited with its
own event, and the flow is claimed when they all pass (a race the statement lost, or nothing wrong after all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import FlowRefused
from .handles import binding_hash, state_hash
from .records import ElicitationRecord, FlowRecord
from .states import ElicitationStatus

if TYPE_CHECKING:
    from .browser import BrowserFlow

# The statuses of an elicitation whose callback may still finish it (a cancelled one stores its grant: `usable`).
CALLBACK_STATUSES = tuple(s.value for s in ElicitationStatus if not s.terminal or s is ElicitationStatus.CANCELLED)


async def claim_for_callback(
    steps: BrowserFlow, provider_name: str, state: str, browser_binding: str | None
) -> tuple[FlowRecord, ElicitationRecord, bool]:
    """The callback's flow claimed, its elicitation and whether its user held a grant at the provider: the usual
    callback in one statement whose conditions are the checks, any other by `claim_checked`."""
    if browser_binding is not None:
        found = await steps.store.flows.claim_with_elicitation(
            state_hash(state),
            steps.now(),
            provider=provider_name,
            binding_hash=binding_hash(browser_binding),
            statuses=CALLBACK_STATUSES,
        )
        if found is not None:
            return found
    return await claim_checked(steps, provider_name, state, browser_binding)


async def claim_checked(
    steps: BrowserFlow, provider_name: str, state: str, browser_binding: str | None
) -> tuple[FlowRecord, ElicitationRecord, bool]:
    """The claimed flow, its elicitation and whether its user held a grant at the provider; FlowRefused (audited)
    when a check fails."""
    store = steps.store
    found = await store.flows.get_with_elicitation(state_hash(state))
    if found is None:
        await steps.elicitations.record_unattributed("unknown_state", provider=provider_name)
        raise FlowRefused("unknown_state")
    flow, record, grant_held = found
    if flow.used_at is not None:
        await _refuse_used_state(steps, flow, record)  # raises, unless the elicitation's own closed page should
    record = await steps.usable(record, allow_cancelled=True)
    if record.provider != provider_name:
        # One redirect URI per provider: an answer for provider A arriving at B's callback is a mix-up.
        await steps.elicitations.audit(record, "provider_mismatch", detail={"callback_provider": provider_name})
        raise FlowRefused("provider_mismatch")
    if browser_binding is None or binding_hash(browser_binding) != flow.browser_binding_hash:
        await steps.elicitations.audit(record, "browser_mismatch")
        raise FlowRefused("browser_mismatch")
    claimed = await store.flows.claim(flow.state_hash, steps.now())
    if claimed is None:
        await _state_not_claimable(steps, flow, record)  # raises
    assert claimed is not None
    return claimed, record, grant_held


async def _refuse_used_state(steps: BrowserFlow, flow: FlowRecord, record: ElicitationRecord) -> None:
    """A state that was used before comes back: a replay, unless its elicitation ended some other way."""
    if record.status.terminal and record.status is not ElicitationStatus.COMPLETED:
        return  # declined, expired, ...: `open_elicitation` refuses with that
    await _state_not_claimable(steps, flow, record)


async def _state_not_claimable(steps: BrowserFlow, flow: FlowRecord, record: ElicitationRecord) -> None:
    """The state was used before (a replay) or its time ran out: say which, record it, refuse."""
    current = await steps.store.flows.get_by_state_hash(flow.state_hash)
    # Unused yet unclaimable means expired; used means answered before (or superseded by a newer start).
    replay = current is None or current.used_at is not None
    await steps.elicitations.audit(record, "replay_attempt" if replay else "state_expired")
    raise FlowRefused("state_used" if replay else "state_expired")
