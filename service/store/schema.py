"""Schema versions: running the Alembic migrations, and checking that this code may run on a database.

Rolling upgrades need two promises, one from each side:
- the code declares the oldest schema revision it runs against (`OLDEST_SCHEMA_REVISION`): a replica of this
  release serves a database anywhere from that revision to its own head;
- the schema declares the oldest code revision that still runs on it: each migration may set
  `oldest_code_revision` in its file (a contract step raises it; an expand step inherits it), and every migration
  run records the value for the new head in the `schema_compatibility` table. A replica of an older release
  serves a newer database as long as that recorded revision is one it knows.
"""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, delete, insert, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.errors import SchemaNotCurrent

from .engine import connected, create_engine, display_url
from .tables import schema_compatibility

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# Alembic is imported only where a migration runs or a database is not at this code's head: a command that opens
# a current database (most CLI commands, every replica's start) checks it without loading Alembic and the scripts.

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # service/
_PACKAGED_SCRIPTS = _PACKAGE_DIR / "_migrations"  # an installed wheel (pyproject force-includes migrations/ here)
_CHECKOUT_SCRIPTS = _PACKAGE_DIR.parent / "migrations"  # a source checkout or editable install

MIGRATE_COMMAND = "acp-connector migrate"

# The oldest schema revision this code runs against. Raise it (to the head) in the release whose code starts
# to use something a migration adds: tests/test_rolling_upgrade.py runs the whole flow on a database at it.
OLDEST_SCHEMA_REVISION = "0021"  # 0021: SQLite's steps carry the flow row and a first grant (through triggers)


def script_location() -> Path:
    """The Alembic script directory: the packaged copy in a wheel, else the checkout's migrations/."""
    for candidate in (_PACKAGED_SCRIPTS, _CHECKOUT_SCRIPTS):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(f"no Alembic migrations found at {_PACKAGED_SCRIPTS} or {_CHECKOUT_SCRIPTS}")


def alembic_config(url: str | None = None) -> Config:
    """A programmatic Alembic config (no alembic.ini); migrations/env.py reads `attributes["url"]`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        config.attributes["url"] = url
    return config


def head_revision() -> str:
    """The revision this code's schema is at."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the repository always ships at least one revision
        raise RuntimeError("the migrations directory has no revisions")
    return head


def migrate(url: str, revision: str = "head") -> tuple[str, ...]:
    """Upgrade the database at `url` to `revision`, by default the head (creating it, for SQLite); returns the
    revisions it was at before (empty for a new database).

    Blocks until done. Safe to call from inside a running event loop: the migration then runs on its own
    thread (Alembic's env.py drives its own loop). Raises DatabaseUnavailable, saying why, when the database
    cannot be reached or opened.
    """
    before: list[str] = []

    def upgrade() -> None:
        before.extend(asyncio.run(stored_revisions(url)))
        if revision == "head" and tuple(before) == (declared_head(),):
            return  # at the head already: nothing for Alembic to do (and nothing to load it for)
        from alembic import command

        command.upgrade(alembic_config(url), revision)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        upgrade()
        return tuple(before)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, name="connector-migrate")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return tuple(before)


async def stored_revisions(url: str) -> tuple[str, ...]:
    """The revisions the database at `url` is at (empty when never migrated); raises DatabaseUnavailable with the
    reason when it cannot be opened."""
    engine = create_engine(url)
    try:
        async with connected(engine) as conn:
            return await conn.run_sync(current_revisions)
    finally:
        await engine.dispose()


def current_revisions(connection: Connection) -> tuple[str, ...]:
    """The revisions recorded in the database's alembic_version table (empty when it was never migrated)."""
    if not inspect(connection).has_table("alembic_version"):
        return ()
    return tuple(sorted(row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))))


_REVISION = re.compile(r'^revision(?:: [^=]+)? = "([^"]+)"$', re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision(?:: [^=]+)? = (.+)$", re.MULTILINE)


@functools.cache
def declared_head() -> str | None:
    """The head of the migration scripts, read from their `revision` and `down_revision` lines without loading
    them (None when the files do not say it plainly: one linear chain of quoted ids). `head_revision()` is the
    authority; a test holds the two equal."""
    revisions: set[str] = set()
    pointed_to: set[str] = set()
    for script in (script_location() / "versions").glob("*.py"):
        source = script.read_text(encoding="utf-8")
        revision, down = _REVISION.search(source), _DOWN_REVISION.search(source)
        if revision is None or down is None:
            return None
        revisions.add(revision.group(1))
        pointed_to.update(re.findall(r'"([^"]+)"', down.group(1)))
    heads = revisions - pointed_to
    return next(iter(heads)) if len(heads) == 1 else None


def declared_oldest_code_revision(script: ScriptDirectory, revision: str) -> str | None:
    """What a schema at `revision` promises: the newest migration up to it that declares `oldest_code_revision`."""
    for step in script.iterate_revisions(revision, "base"):
        declared = getattr(step.module, "oldest_code_revision", None)
        if isinstance(declared, str):
            return declared
    return None


def record_compatibility(connection: Connection, script: ScriptDirectory) -> None:
    """After a migration run (inside its transaction): store the promise of the revision the database is now at."""
    heads = current_revisions(connection)
    if len(heads) != 1 or not inspect(connection).has_table(schema_compatibility.name):
        return
    oldest = declared_oldest_code_revision(script, heads[0]) or heads[0]
    connection.execute(delete(schema_compatibility))
    connection.execute(insert(schema_compatibility).values(id=1, oldest_code_revision=oldest))


def _recorded_oldest_code_revision(connection: Connection) -> str | None:
    if not inspect(connection).has_table(schema_compatibility.name):
        return None
    return connection.execute(select(schema_compatibility.c.oldest_code_revision)).scalar()


async def check_schema(conn: AsyncConnection) -> None:
    """Raise SchemaNotCurrent unless this code may run on the database (see the module docstring), saying what to do."""
    where = f"database at {display_url(conn.engine.url)}"
    current = await conn.run_sync(current_revisions)
    if current and current == (declared_head(),):
        return  # the usual case, known without Alembic
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    if current == (head,):
        return
    if not current:
        raise SchemaNotCurrent(where, f"is not migrated: run `{MIGRATE_COMMAND}`")
    known = {revision.revision for revision in script.walk_revisions()}
    unknown = [revision for revision in current if revision not in known]
    if unknown:
        if await conn.run_sync(_recorded_oldest_code_revision) in known:
            return  # a newer schema that still runs this code (expand before contract)
        raise SchemaNotCurrent(
            where, f"was migrated by a newer version (revision {', '.join(unknown)}): upgrade the connector"
        )
    assert head is not None
    supported = {step.revision for step in script.iterate_revisions(head, OLDEST_SCHEMA_REVISION, inclusive=True)}
    if all(revision in supported for revision in current):
        return
    raise SchemaNotCurrent(
        where,
        "is not migrated to this version's schema "
        f"(revision {', '.join(current)}, need {OLDEST_SCHEMA_REVISION} or later): run `{MIGRATE_COMMAND}`",
    )
