"""How a step writes the rows that go with its change, per database: the one place that decides.

A step changes an elicitation (inserts it, moves its status, settles its telling, or records that its consent page
was opened) and writes its audit row with the change; some steps also write the OAuth flow they start, the event-log
row of their ending, a user's first grant. Each is written exactly when the change happens, by its statement:
- PostgreSQL (`PostgresSteps`): data-modifying CTEs in the change's statement write all of them.
- SQLite (`SqliteSteps`) has no data-modifying CTE: the change's statement sets `elicitations.step_note`, a JSON
  object holding the audit row and the ending's event-log row as stored, and triggers insert them (migration 0020:
  they copy, they decide nothing). The flow row and the grant are statements of their own in the step's transaction.

The repository (`ElicitationRepository`) asks this module for a step's statement and parameters and writes what the
statement did not (`Carried`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

from sqlalchemy import Dialect

from service.core.records import FlowRecord, GrantRecord

from .audit import audit_params
from .elicitation_sql import (
    AUDITED,
    GET_AUDITED,
    INSERT,
    NOTED_SETTLE,
    OPEN_NOTED,
    SETTLED,
    audited_transition,
    noted_transition,
    transition_statement,
)
from .engine import dump_json
from .flow_rows import flow_row
from .grant_rows import to_row as grant_row
from .tables import audit_events, oauth_flows

Row = Mapping[str, Any]
# A statement and the parameters it takes (beside the change's own, for a transition or a settle).
Step = tuple[Any, dict[str, Any]]


class Carried(NamedTuple):
    """Which of the rows that go with a transition its statement writes (the caller writes the others)."""

    audit: bool
    flow: bool
    ending: bool


class StepWrites(ABC):
    # A user's first grant is inserted by its ending's statement (else the caller inserts it first).
    carries_grant: ClassVar[bool]
    # The consent page's statement returns the elicitation also when it writes no `opened` row (else the caller
    # reads it then).
    opening_reads: ClassVar[bool]

    @abstractmethod
    def insert(self, row: Row, audit: Row | None) -> Step:
        """A new elicitation's `row`, with its `audit` row."""

    @abstractmethod
    def opened(self, id: str, now: datetime, audit: Row) -> Step:
        """The consent page's read, with its `audit` row (`opened`: id, identity and provider taken from the row)
        while the elicitation is open at `now`; the rows it returns have an `audited` column."""

    @abstractmethod
    def transition(
        self,
        *,
        reason: bool,
        taking: bool,
        audit: Row | None,
        flow: FlowRecord | None,
        ending: Row | None,
        grant: GrantRecord | None,
    ) -> tuple[Step, Carried]:
        """A status change (`reason`, `taking`: as `transition_statement`) with its `audit` row, the `flow` it starts,
        the event-log row of its `ending` (`OutboxRepository.event_row`), the first `grant` it stores."""

    @abstractmethod
    def settle(self, audit: Row | None) -> Step:
        """How a completion's telling ended, with its `audit` row; returns a row when it was recorded."""


class PostgresSteps(StepWrites):
    carries_grant = True
    opening_reads = True

    def insert(self, row: Row, audit: Row | None) -> Step:
        return (INSERT, dict(row)) if audit is None else (AUDITED["insert"], {**row, **audit_params(audit)})

    def opened(self, id: str, now: datetime, audit: Row) -> Step:
        return GET_AUDITED, {"elicitation_id": id, "now": now, **audit_params(audit)}

    def transition(
        self,
        *,
        reason: bool,
        taking: bool,
        audit: Row | None,
        flow: FlowRecord | None,
        ending: Row | None,
        grant: GrantRecord | None,
    ) -> tuple[Step, Carried]:
        if audit is None:
            return (transition_statement(reason=reason, taking=taking), {}), Carried(False, False, False)
        params = audit_params(audit)
        if flow is not None:
            params.update({f"{oauth_flows.name}_{k}": v for k, v in flow_row(flow).items()})
        if ending is not None:
            params.update({f"event_{k}": v for k, v in ending.items()})
        granted = grant_row(grant) if grant is not None else {}
        params.update({f"grants_{k}": v for k, v in granted.items()})
        statement = audited_transition(
            reason=reason, taking=taking, flow=flow is not None, logged=ending is not None, granted=tuple(granted)
        )
        return (statement, params), Carried(True, flow is not None, ending is not None)

    def settle(self, audit: Row | None) -> Step:
        return (SETTLED, {}) if audit is None else (AUDITED["settle"], audit_params(audit))


class SqliteSteps(StepWrites):
    carries_grant = False
    opening_reads = False

    def __init__(self, dialect: Dialect) -> None:
        # A time as SQLite stores it (text), which the triggers copy from the note unchanged.
        stored = audit_events.c.at.type.dialect_impl(dialect).bind_processor(dialect)
        assert stored is not None
        self._stored_time: Callable[[datetime], str] = stored

    def note(self, audit: Row, ending: Row | None = None) -> str:
        """The `step_note` of a step: its audit row and its ending's event-log row, as the triggers insert them."""
        note = {"audit_events": {**audit, "at": self._stored_time(audit["at"])}}
        if ending is not None:
            note["elicitation_events"] = {**ending, "at": self._stored_time(ending["at"])}
        return dump_json(note)

    def insert(self, row: Row, audit: Row | None) -> Step:
        return INSERT, (dict(row) if audit is None else {**row, "step_note": self.note(audit)})

    def opened(self, id: str, now: datetime, audit: Row) -> Step:
        return OPEN_NOTED, {"elicitation_id": id, "now": now, "step_note": self.note(audit)}

    def transition(
        self,
        *,
        reason: bool,
        taking: bool,
        audit: Row | None,
        flow: FlowRecord | None,
        ending: Row | None,
        grant: GrantRecord | None,
    ) -> tuple[Step, Carried]:
        assert grant is None, "the caller inserts the grant first (carries_grant)"
        if audit is None:
            return (transition_statement(reason=reason, taking=taking), {}), Carried(False, False, False)
        statement = noted_transition(reason=reason, taking=taking, logged=ending is not None)
        return (statement, {"step_note": self.note(audit, ending)}), Carried(True, False, ending is not None)

    def settle(self, audit: Row | None) -> Step:
        return (SETTLED, {}) if audit is None else (NOTED_SETTLE, {"step_note": self.note(audit)})


def step_writes(dialect: Dialect) -> StepWrites:
    """How steps write their rows on `dialect`'s database."""
    return PostgresSteps() if dialect.name == "postgresql" else SqliteSteps(dialect)
