"""Schema versions: running the Alembic migrations, and checking a database is at this code's revision."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.errors import SchemaNotCurrent

from .engine import display_url, probe

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # service/
_PACKAGED_SCRIPTS = _PACKAGE_DIR / "_migrations"  # an installed wheel (pyproject force-includes migrations/ here)
_CHECKOUT_SCRIPTS = _PACKAGE_DIR.parent / "migrations"  # a source checkout or editable install

MIGRATE_COMMAND = "acp-connector migrate"


def script_location() -> Path:
    """The Alembic script directory: the packaged copy in a wheel, else the checkout's migrations/."""
    for candidate in (_PACKAGED_SCRIPTS, _CHECKOUT_SCRIPTS):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(f"no Alembic migrations found at {_PACKAGED_SCRIPTS} or {_CHECKOUT_SCRIPTS}")


def alembic_config(url: str | None = None) -> Config:
    """A programmatic Alembic config (no alembic.ini); migrations/env.py reads `attributes["url"]`."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        config.attributes["url"] = url
    return config


def head_revision() -> str:
    """The revision this code's schema is at."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the repository always ships at least one revision
        raise RuntimeError("the migrations directory has no revisions")
    return head


def migrate(url: str) -> None:
    """Upgrade the database at `url` to the head revision (creating it, for SQLite).

    Blocks until done. Safe to call from inside a running event loop: the migration then runs on its own
    thread (Alembic's env.py drives its own loop). Raises DatabaseUnavailable, saying why, when the database
    cannot be reached or opened.
    """
    config = alembic_config(url)

    def upgrade() -> None:
        asyncio.run(probe(url))
        command.upgrade(config, "head")

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        upgrade()
        return
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


def current_revisions(connection: Connection) -> tuple[str, ...]:
    """The revisions recorded in the database's alembic_version table (empty when it was never migrated)."""
    return tuple(MigrationContext.configure(connection).get_current_heads())


async def check_schema(conn: AsyncConnection) -> None:
    """Raise SchemaNotCurrent unless the database is exactly at `head_revision()`, saying what to run."""
    where = f"database at {display_url(conn.engine.url)}"
    current = await conn.run_sync(current_revisions)
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    if current == (head,):
        return
    if not current:
        raise SchemaNotCurrent(f"{where} is not migrated: run `{MIGRATE_COMMAND}`")
    known = {revision.revision for revision in script.walk_revisions()}
    unknown = [revision for revision in current if revision not in known]
    if unknown:
        raise SchemaNotCurrent(
            f"{where} was migrated by a newer version (revision {', '.join(unknown)}): upgrade the connector"
        )
    raise SchemaNotCurrent(
        f"{where} is not migrated to this version's schema "
        f"(revision {', '.join(current)}, need {head}): run `{MIGRATE_COMMAND}`"
    )
