"""The statements of the elicitation repository, built once (building and keying a statement costs more than
running it); on PostgreSQL a step's audit row, the flow it starts and the ending it logs go in its statement."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import bindparam, exists, insert, select, true, update
from sqlalchemy.dialects import postgresql

from service.core.states import CompletionDelivery, ElicitationStatus

from .audit import audit_insert_of, rows_beside, with_audit_row
from .grants import ACCOUNT_KEY
from .outbox import logged_insert_of
from .tables import audit_events, elicitations, grants, oauth_flows

# The statements every flow runs, built once (building and keying a statement costs more than running it).
INSERT = insert(elicitations)
GET = select(elicitations).where(elicitations.c.id == bindparam("elicitation_id"))
TRANSITION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.status.in_(bindparam("from_statuses", expanding=True)),
    )
    .values(status=bindparam("new_status"), updated_at=bindparam("now"))
    .returning(*elicitations.c)
)
INSERT_FLOW = insert(oauth_flows)
RELEASE_TELLING = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.completion_delivery == CompletionDelivery.DELIVERING.value,
    )
    .values(completion_delivery=None)
)
CLAIM_COMPLETION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.status == ElicitationStatus.COMPLETED.value,
        elicitations.c.replica_id == bindparam("claiming_replica"),
        elicitations.c.completion_delivery.is_(None),
    )
    .values(completion_delivery=CompletionDelivery.DELIVERING.value)
    .returning(elicitations.c.updated_at)
)
SETTLE_COMPLETION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.completion_delivery == CompletionDelivery.DELIVERING.value,
    )
    .values(completion_delivery=bindparam("outcome"))
)


# The same with the step's audit row in the statement (PostgreSQL: a data-modifying CTE, `with_audit_row`).
# Every column `_to_row` gives (the two left out start NULL or 0 and change later): a column added to the table
# without a value there makes this insert fail loudly rather than store NULL.
_ROW_COLUMNS = [c.name for c in elicitations.c if c.name not in ("identity_mismatches", "completion_delivery")]
AUDITED = {
    "insert": with_audit_row(
        insert(elicitations).values({n: bindparam(n) for n in _ROW_COLUMNS}).returning(elicitations.c.id)
    ),
    "settle": with_audit_row(SETTLE_COMPLETION.returning(elicitations.c.id)),
}


@cache
def first_grant(columns: tuple[str, ...]) -> Any:
    """PostgreSQL: a CTE inserting a user's first grant at a provider from parameters named `grants_<column>` (nothing
    when its account holds one by now: `GrantRepository.insert_new`), returning its id."""
    new = postgresql.insert(grants).values({n: bindparam(f"grants_{n}", type_=grants.c[n].type) for n in columns})
    return new.on_conflict_do_nothing(index_elements=list(ACCOUNT_KEY)).returning(grants.c.id).cte("given")


@cache
def transition_statement(
    *, reason: bool, taking: bool, audited: bool, flow: bool, logged: bool, granted: tuple[str, ...] = ()
) -> Any:
    """The transition's statement, built once per shape: with the failure reason, the telling taken (`take_telling`);
    and on PostgreSQL (`audited`) with the audit row, the flow it starts, the ending logged, the first grant of the
    columns `granted` inserted, in one statement."""
    statement = TRANSITION
    if reason:
        statement = statement.values(failure_reason=bindparam("reason"))
    if taking:
        statement = statement.values(completion_delivery=CompletionDelivery.DELIVERING.value)
    if granted:  # the ending only when its first grant went in (`ElicitationRepository.end`)
        statement = statement.where(exists(select(first_grant(granted).c.id)))
    if not audited:
        return statement
    changed = statement.cte("changed")
    ctes = [audit_insert_of(changed), *([rows_beside(changed, oauth_flows)] if flow else [])]
    if not logged:
        return select(*changed.c).add_cte(*ctes)
    ending = logged_insert_of(changed)
    return (
        select(*changed.c, ending.c.id.label("logged_event_id"))
        .select_from(changed.join(ending, true()))
        .add_cte(*ctes)
    )


# PostgreSQL: the elicitation read, and an audit row about it written in the same statement while it is open (not
# terminal, not expired): the consent page's `opened`. The row's identity and provider come from the elicitation, so
# only a row whose values `audit_row` would store unchanged (no control character to escape) is written here; another
# is written by the caller (`get_audited`).
_CONTROL_CHARACTER = "[\\x01-\\x1f\\x7f-\\x9f]"
_AUDIT_IF_OPEN = (
    insert(audit_events)
    .from_select(
        ["at", "event", "elicitation_id", "identity_issuer", "identity_subject", "provider", "detail"],
        select(
            bindparam("audit_at", type_=audit_events.c.at.type),
            bindparam("audit_event", type_=audit_events.c.event.type),
            elicitations.c.id,
            elicitations.c.identity_issuer,
            elicitations.c.identity_subject,
            elicitations.c.provider,
            bindparam("audit_detail", type_=audit_events.c.detail.type),
        ).where(
            elicitations.c.id == bindparam("elicitation_id"),
            elicitations.c.status.in_([s.value for s in ElicitationStatus if not s.terminal]),
            elicitations.c.expires_at > bindparam("now"),
            *(
                ~c.regexp_match(_CONTROL_CHARACTER)
                for c in (elicitations.c.identity_issuer, elicitations.c.identity_subject, elicitations.c.provider)
            ),
        ),
    )
    .returning(audit_events.c.id)
    .cte("audited")
)
GET_AUDITED = GET.add_columns(exists(select(_AUDIT_IF_OPEN.c.id)).label("audited")).add_cte(_AUDIT_IF_OPEN)
