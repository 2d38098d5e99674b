"""The statements of the elicitation repository, built once (building and keying a statement costs more than
running it). A step's statement also writes the rows that go with its change: on PostgreSQL in data-modifying CTEs
(its audit row, the flow it starts, the ending it logs, a first grant), on SQLite through the triggers that read the
`step_note` it sets (its audit row, the ending it logs, the flow it starts, a first grant). Which a step runs is decided
in `step_writes`."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql

from service.core.states import CompletionDelivery, ElicitationStatus

from .audit import audit_insert_of, rows_beside, with_audit_row
from .elicitation_rows import elicitation_columns
from .grants import ACCOUNT_KEY
from .outbox import logged_insert_of
from .tables import audit_events, elicitation_events, elicitations, grants, oauth_flows

# The statements every flow runs, built once (building and keying a statement costs more than running it).
INSERT = insert(elicitations)
GET = select(*elicitation_columns).where(elicitations.c.id == bindparam("elicitation_id"))
TRANSITION = (
    update(elicitations)
    .where(
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.status.in_(bindparam("from_statuses", expanding=True)),
    )
    .values(status=bindparam("new_status"), updated_at=bindparam("now"))
    .returning(*elicitation_columns)
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
SETTLED = SETTLE_COMPLETION.returning(elicitations.c.id)


# PostgreSQL: the same with the step's audit row in the statement (a data-modifying CTE, `with_audit_row`).
# Every column `_to_row` gives (those left out start NULL or 0 and change later; `step_note` and `step_blob` are
# SQLite's): a column added to the table without a value there makes this insert fail loudly rather than store NULL.
_LEFT_OUT = ("identity_mismatches", "completion_delivery", "step_note", "step_blob")
_ROW_COLUMNS = [c.name for c in elicitations.c if c.name not in _LEFT_OUT]
AUDITED = {
    "insert": with_audit_row(
        insert(elicitations).values({n: bindparam(n) for n in _ROW_COLUMNS}).returning(elicitations.c.id)
    ),
    "settle": with_audit_row(SETTLED),
}


@cache
def first_grant(columns: tuple[str, ...]) -> Any:
    """PostgreSQL: a CTE inserting a user's first grant at a provider from parameters named `grants_<column>` (nothing
    when its account holds one by now: `GrantRepository.insert_new`), returning its id."""
    new = postgresql.insert(grants).values({n: bindparam(f"grants_{n}", type_=grants.c[n].type) for n in columns})
    return new.on_conflict_do_nothing(index_elements=list(ACCOUNT_KEY)).returning(grants.c.id).cte("given")


@cache
def transition_statement(*, reason: bool, taking: bool) -> Any:
    """The transition's UPDATE, built once per shape: with the failure reason, the telling taken (`take_telling`)."""
    statement = TRANSITION
    if reason:
        statement = statement.values(failure_reason=bindparam("reason"))
    if taking:
        statement = statement.values(completion_delivery=CompletionDelivery.DELIVERING.value)
    return statement


@cache
def audited_transition(*, reason: bool, taking: bool, flow: bool, logged: bool, granted: tuple[str, ...]) -> Any:
    """PostgreSQL: the transition with its audit row, the flow it starts, the ending logged, the first grant of the
    columns `granted` inserted, in one statement."""
    statement = transition_statement(reason=reason, taking=taking)
    if granted:  # the ending only when its first grant went in (`ElicitationRepository.end`)
        statement = statement.where(exists(select(first_grant(granted).c.id)))
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
_CONTROL_CHARACTER = {"postgresql": "[\\x01-\\x1f\\x7f-\\x9f]", "sqlite": "[\\x00-\\x1f\\x7f-\\x9f]"}
_ROW_AUDIT_COLUMNS = (elicitations.c.identity_issuer, elicitations.c.identity_subject, elicitations.c.provider)


def _open_and_stored_as_is(dialect: str) -> tuple[ColumnElement[bool], ...]:
    """The elicitation `elicitation_id` open at `now`, its identity and provider fit to be copied into an audit row
    unchanged (`audit_row` would escape no character and cut nothing; SQLite does not hold a column to its length)."""
    return (
        elicitations.c.id == bindparam("elicitation_id"),
        elicitations.c.status.in_([s.value for s in ElicitationStatus if not s.terminal]),
        elicitations.c.expires_at > bindparam("now"),
        *(~c.regexp_match(_CONTROL_CHARACTER[dialect]) for c in _ROW_AUDIT_COLUMNS),
        *(func.length(c) <= audit_events.c[c.name].type.length for c in _ROW_AUDIT_COLUMNS),  # type: ignore[attr-defined]
    )


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
        ).where(*_open_and_stored_as_is("postgresql")),
    )
    .returning(audit_events.c.id)
    .cte("audited")
)
GET_AUDITED = GET.add_columns(exists(select(_AUDIT_IF_OPEN.c.id)).label("audited")).add_cte(_AUDIT_IF_OPEN)


# SQLite: the statements that set `step_note`, whose rows the triggers of migration 0020 insert (`step_writes`).
NOTED_SETTLE = SETTLED.values(step_note=bindparam("step_note"))
# The ending's event-log row, which the UPDATE's trigger wrote before the row changed: the log's newest, SQLite having
# one writer at a time (as `OutboxRepository.append` relies on), and found without reading the table.
_LOGGED_ID = select(func.max(elicitation_events.c.id)).scalar_subquery().label("logged_event_id")


# SQLite: a user's first grant goes in with its ending only while its account holds none (the grant's key columns as
# parameters `grants_<column>`), as `first_grant` on PostgreSQL; the trigger copying it decides nothing.
_NO_GRANT_HELD = ~exists().where(*(grants.c[n] == bindparam(f"grants_{n}") for n in ACCOUNT_KEY))


@cache
def noted_transition(*, reason: bool, taking: bool, logged: bool, carrying: bool, granting: bool) -> Any:
    """SQLite: the transition setting the step's note; returning the id of the ending's event-log row (`logged`).
    `carrying`: the note carries a row whose ciphertext is `step_blob` (the flow it starts, a first grant: migration
    0021), `granting`: a first grant, the move only while its account holds none."""
    statement = transition_statement(reason=reason, taking=taking).values(step_note=bindparam("step_note"))
    if carrying:
        statement = statement.values(step_blob=bindparam("step_blob"))
    if granting:
        statement = statement.where(_NO_GRANT_HELD)
    return statement.returning(_LOGGED_ID) if logged else statement


# The consent page's read as one UPDATE: `opened` noted while the elicitation is open (its id, identity and provider
# taken from the row, as `GET_AUDITED` does); no row when it is not, and the caller reads it then.
OPEN_NOTED = (
    update(elicitations)
    .where(*_open_and_stored_as_is("sqlite"))
    .values(
        step_note=func.json_set(
            bindparam("step_note"),
            *(x for c in (elicitations.c.id, *_ROW_AUDIT_COLUMNS) for x in (f"$.audit_events.{c.name}", c)),
        )
    )
    .returning(*elicitation_columns, literal(True).label("audited"))
)
