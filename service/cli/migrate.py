"""`acp-connector migrate`: bring the database to this version's schema."""

from __future__ import annotations

from .framework import Commands, Invocation


def register(commands: Commands) -> None:
    commands.command(
        "migrate",
        run,
        help="apply database migrations",
        description=(
            "Upgrade the database at database.url to this version's schema (creating a SQLite file and its\n"
            "folder if needed). Safe to run again: an up-to-date database is left as it is. Run it after every\n"
            "upgrade, before `serve` (which refuses an unmigrated database)."
        ),
        examples=[
            "acp-connector migrate",
            "CONNECTOR_DATABASE__URL=postgresql+asyncpg://connector@db/connector acp-connector migrate",
        ],
    )


def run(invocation: Invocation) -> int:
    from ..bootstrap import migrate_database
    from ..store import display_url, head_revision
    from ..store.schema import declared_head

    settings = invocation.settings()
    before = migrate_database(settings)
    where, head = display_url(settings.database.url), declared_head() or head_revision()
    if before == (head,):
        invocation.note(f"database at {where} was already at revision {head}, this version's schema: nothing to do")
    elif before:
        invocation.note(f"database at {where} migrated from revision {', '.join(before)} to {head}")
    else:
        invocation.note(f"database at {where} created at revision {head}, this version's schema")
    return 0
