"""How a step writes the rows that go with its change, per database: the one place that decides.

A step changes an elicitation (inserts it, moves its status, settles its telling, or records that its consent page
was opened) and writes its audit row with the change; some steps also write the OAuth flow they start, the event-log
row of their ending, a user's first grant. Each is written exactly when the change happens, by its statement:
- PostgreSQL (`PostgresSteps`): data-modifying CTEs in the change's statement write all of them.
- SQLite (`SqliteSteps`) has no data-modifying CTE: the change's statement sets `elicitations.step_note`, a JSON
  object holding the audit row, the ending's event-log row, the flow it starts and a first grant as stored, and
  triggers insert them (migrations 0020 and 0021: they copy, they decide nothing). A flow's or a grant's ciphertext,
  which JSON cannot hold, goes in `elicitations.step_blob`; the note that carries such a row and the blob are cleared
  by a trigger in the same statement, so no copy stays on the elicitation. A row holding a text that the triggers
  would not copy as it is (a NUL: `json_extract` ends a text there) is not carried: the repository writes it.

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
from service.util.text import storable

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
from .grants import ACCOUNT_KEY
from .tables import audit_events, elicitation_events, grants, oauth_flows

Row = Mapping[str, Any]
# SQLite: the rows a step's note may carry, each with its ciphertext column (bound as `step_blob`, migration 0021).
_CARRIED = {oauth_flows.name: "verifier_ciphertext", grants.name: "token_ciphertext"}
# A statement and the parameters it takes (beside the change's own, for a transition or a settle).
Step = tuple[Any, dict[str, Any]]


class Carried(NamedTuple):
    """Which of the rows that go with a transition its statement writes (the caller writes the others)."""

    audit: bool
    flow: bool
    ending: bool


class StepWrites(ABC):
    # A user's first grant is inserted by its ending's statement also when the ending does not happen (else the caller
    # inserts it then).
    grant_without_ending: ClassVar[bool]
    # The consent page's statement returns the elicitation also when it writes no `opened` row (else the caller
    # reads it then).
    opening_reads: ClassVar[bool]

    @abstractmethod
    def carries(self, grant: GrantRecord) -> bool:
        """Whether a first grant's ending (`transition` with `grant`) can insert it (else the caller does, first)."""

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
    grant_without_ending = True
    opening_reads = True

    def carries(self, grant: GrantRecord) -> bool:
        return True

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
    grant_without_ending = False
    opening_reads = False

    def __init__(self, dialect: Dialect) -> None:
        # Values as SQLite stores them (a time as text), which the triggers copy from the note unchanged.
        self._stored: dict[str, dict[str, Callable[[Any], Any]]] = {
            table.name: {c.name: p for c in table.c if (p := c.type.dialect_impl(dialect).bind_processor(dialect))}
            for table in (audit_events, elicitation_events, oauth_flows, grants)
        }

    def _as_stored(self, table: str, row: Row, left_out: str | None = None) -> dict[str, Any]:
        stored = self._stored[table]
        return {k: v if v is None or k not in stored else stored[k](v) for k, v in row.items() if k != left_out}

    def note(self, audit: Row, ending: Row | None = None, carried: tuple[str, Row] | None = None) -> str:
        """The `step_note` of a step: its audit row, its ending's event-log row and the row it `carried` (a table of
        `_CARRIED` and its row, without its ciphertext), as the triggers insert them."""
        note = {"audit_events": self._as_stored("audit_events", audit)}
        if ending is not None:
            note["elicitation_events"] = self._as_stored("elicitation_events", ending)
        if carried is not None:
            table, row = carried
            note[table] = self._as_stored(table, row, _CARRIED[table])
        return dump_json(note)

    @staticmethod
    def _as_is(row: Row) -> bool:
        """Whether the note would carry `row`'s texts as they are (a row holding one that it would not is written by
        a statement of its own)."""
        return all(storable(v) for v in row.values() if isinstance(v, str))

    def carries(self, grant: GrantRecord) -> bool:
        return self._as_is(grant_row(grant))

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
        if audit is None:
            assert flow is None and grant is None
            return (transition_statement(reason=reason, taking=taking), {}), Carried(False, False, False)
        assert flow is None or grant is None, "a step carries one row with a ciphertext"
        carried: tuple[str, Row] | None = None
        params: dict[str, Any] = {}
        if flow is not None and self._as_is(started := flow_row(flow)):  # else `_write_beside` inserts it
            carried = oauth_flows.name, started
        if grant is not None:
            carried = grants.name, grant_row(grant)
            assert self._as_is(carried[1]), "a grant the note cannot carry is inserted by the caller (`carries`)"
            params.update({f"grants_{k}": v for k, v in carried[1].items() if k in ACCOUNT_KEY})
        if carried is not None:
            table, row = carried
            params["step_blob"] = row[_CARRIED[table]]
        params["step_note"] = self.note(audit, ending, carried)
        logged, carrying, granting = ending is not None, carried is not None, grant is not None
        statement = noted_transition(reason=reason, taking=taking, logged=logged, carrying=carrying, granting=granting)
        return (statement, params), Carried(True, flow is not None and carrying, ending is not None)

    def settle(self, audit: Row | None) -> Step:
        return (SETTLED, {}) if audit is None else (NOTED_SETTLE, {"step_note": self.note(audit)})


def step_writes(dialect: Dialect) -> StepWrites:
    """How steps write their rows on `dialect`'s database."""
    return PostgresSteps() if dialect.name == "postgresql" else SqliteSteps(dialect)
