"""The command line's answers where it used to answer wrong: one true line, the right exit code.

`serve` on a taken port, `serve --host/--port`, `keys retire` of a key nobody has, a webhook URL that is no URL,
ports out of range, a config file that is not UTF-8 or is a directory, what `migrate` did; the audit lines a
command's change writes only with `--verbose`; and what `--help`, `--version` and the commands import (the CLI
stays fast by not importing what it does not use: checked by module, never by a clock).
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from service.cli import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from service.config import load_settings
from service.store.schema import head_revision, migrate
from service.vault import generate_key

from .test_cli import CLI, REPO, cli, free_port, no_traceback, scratch_env


@pytest.fixture
def database(tmp_path: Path) -> dict[str, str]:
    """The environment of a migrated SQLite database with a key ring of one key (no development key file)."""
    env = {
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path}/connector.db",
        "CONNECTOR_VAULT__KEYS": generate_key("k-test"),
    }
    assert cli("migrate", env=env).code == EXIT_OK
    return env


def audit_events(env: dict[str, str], event: str) -> int:
    path = env["CONNECTOR_DATABASE__URL"].removeprefix("sqlite+aiosqlite:///")
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM audit_events WHERE event = ?", (event,)).fetchone()[0])


# -- serve: --host/--port, and a taken port --------------------------------------------------------------------


@pytest.mark.duration(4)
def test_serve_on_a_taken_port_says_so_in_one_line_and_exits_1(tmp_path: Path) -> None:
    env = scratch_env(
        tmp_path, CONNECTOR_DATABASE__URL=f"sqlite+aiosqlite:///{tmp_path}/c.db", CONNECTOR_VAULT__KEYS=generate_key()
    )
    subprocess.run([*CLI, "migrate"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    with taken_port() as port:
        result = subprocess.run(
            [*CLI, "serve", "--port", str(port)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
    assert result.returncode == EXIT_RUNTIME, result.stderr
    no_traceback(result.stderr)
    assert result.stderr.splitlines() == [
        f"acp-connector: serve: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(stop what uses it, or choose another port: --port or server.port)"
    ]


@contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.duration(4)
def test_serve_listens_where_host_and_port_say(tmp_path: Path) -> None:
    port = free_port()
    env = scratch_env(
        tmp_path, CONNECTOR_DATABASE__URL=f"sqlite+aiosqlite:///{tmp_path}/c.db", CONNECTOR_VAULT__KEYS=generate_key()
    )
    subprocess.run([*CLI, "migrate"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    server = subprocess.Popen(
        [*CLI, "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_ready(f"http://127.0.0.1:{port}") == 200
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=20)
    no_traceback(stderr)
    # The listener and the address the pages name agree (public_base_url follows the listener on loopback).
    assert f"acp-connector: serving on http://127.0.0.1:{port} (connect pages at /connect/<id>)" in stderr


def wait_ready(base_url: str, seconds: float = 180) -> int:  # a loaded machine starts slowly
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return httpx.get(f"{base_url}/readyz", timeout=2).status_code
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered at {base_url} within {seconds} s")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--port", "0"], "argument --port: '0' is not a port number (1 to 65535)"),
        (["serve", "--port", "65536"], "argument --port: '65536' is not a port number (1 to 65535)"),
        (["mock-provider", "--port", "99999"], "argument --port: '99999' is not a port number (0 to 65535)"),
        (["mock-provider", "--port", "-1"], "argument --port: '-1' is not a port number (0 to 65535)"),
    ],
)
def test_a_port_out_of_range_is_a_usage_error(argv: list[str], says: str) -> None:
    ran = cli(*argv)
    assert ran.code == EXIT_USAGE and says in ran.line


# -- wrong answers, each with one true line --------------------------------------------------------------------


def test_retiring_a_key_nobody_has_is_refused_and_audits_nothing(database: dict[str, str]) -> None:
    ran = cli("keys", "retire", "nosuchkey", env=database)
    assert ran.code == EXIT_RUNTIME
    assert ran.line == (
        "acp-connector: keys retire: no key nosuchkey in the ring or the database "
        "(`acp-connector keys status` lists them)"
    )
    assert audit_events(database, "key_retired") == 0


def test_a_webhook_url_that_is_no_url_is_called_that(database: dict[str, str]) -> None:
    cli("api-keys", "create", "--tenant", "bot", env=database)
    ran = cli("webhooks", "create", "--tenant", "bot", "--url", "not a url", env=database)
    assert ran.code == EXIT_USAGE
    assert "this is not a URL" in ran.line and "2048" not in ran.line
    long = cli("webhooks", "create", "--tenant", "bot", "--url", "https://example.com/" + "a" * 2048, env=database)
    assert long.code == EXIT_USAGE and "the URL is longer than 2048 characters" in long.line


def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "connector.toml"
    config.write_bytes(b'public_base_url = "http://127.0.0.1:8700"\n# caf\xe9\n')
    ran = cli("--config", str(config), "migrate")
    assert ran.code == EXIT_USAGE
    assert str(config) in ran.line and "not UTF-8" in ran.line and "UnicodeDecodeError" not in ran.line


def test_a_config_path_that_is_a_directory_says_so(tmp_path: Path) -> None:
    ran = cli("--config", str(tmp_path), "migrate")
    assert ran.code == EXIT_USAGE
    assert str(tmp_path) in ran.line and "is a directory" in ran.line and "not found" not in ran.line


def test_migrate_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/connector.db"
    head = head_revision()
    created = cli("migrate", env={"CONNECTOR_DATABASE__URL": url})
    assert created.code == EXIT_OK and f"created at revision {head}" in created.line
    again = cli("migrate", env={"CONNECTOR_DATABASE__URL": url})
    assert again.code == EXIT_OK and f"was already at revision {head}" in again.line
    older_url = f"sqlite+aiosqlite:///{tmp_path}/older.db"
    migrate(older_url, "0010")
    upgraded = cli("migrate", env={"CONNECTOR_DATABASE__URL": older_url})
    assert upgraded.code == EXIT_OK and f"migrated from revision 0010 to {head}" in upgraded.line


# -- audit lines: recorded always, shown with --verbose --------------------------------------------------------


def test_audit_lines_are_shown_only_with_verbose(database: dict[str, str]) -> None:
    quiet = cli("api-keys", "create", "--tenant", "bot", env=database)
    assert quiet.code == EXIT_OK and quiet.out.startswith("acpk_")
    assert "audit" not in quiet.err and quiet.err.count("\n") == 1  # the one notice: what was created
    verbose = cli("api-keys", "create", "--tenant", "bot", "--verbose", env=database)
    assert verbose.code == EXIT_OK and "audit api_key_created" in verbose.err
    assert audit_events(database, "api_key_created") == 2  # recorded in the database both times


# -- speed: what gets imported ---------------------------------------------------------------------------------

HEAVY = ("sqlalchemy", "alembic", "pydantic", "structlog", "acp", "uvicorn", "starlette", "httpx", "authlib")


def imported_by(*argv: str, env: dict[str, str] | None = None) -> list[str]:
    """The heavy packages a fresh interpreter has imported after `acp-connector argv...`."""
    script = (
        "import contextlib, io, sys\n"
        "from service.cli.program import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n"
        f"        main({list(argv)!r}, env={env or {}!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["serve", "--help"], ["webhooks", "--help"]])
def test_help_and_version_import_none_of_the_runtime(argv: list[str]) -> None:
    assert imported_by(*argv) == []


def test_a_database_command_imports_the_store_not_the_web_or_the_oauth_client(database: dict[str, str]) -> None:
    # On a database at this code's head the schema check needs no Alembic either (it reads the scripts' ids).
    imported = set(imported_by("keys", "status", env=database))
    assert "sqlalchemy" in imported  # it did open the database
    assert imported.isdisjoint({"alembic", "acp", "uvicorn", "httpx", "authlib"})
    assert "alembic" not in imported_by("migrate", env=database)  # at the head already: nothing to run


def test_a_command_that_logs_nothing_imports_no_log_renderer_and_no_web_stack(database: dict[str, str]) -> None:
    # structlog renders the first line written; the verifiers checked against the [identity.*] tables bring
    # no web framework with them.
    assert set(imported_by("grants", "list", env=database)).isdisjoint({"structlog", "starlette"})
    # A line written brings the renderer (in JSON mode a failed command's one line is a log record).
    assert "structlog" in imported_by("--log-format", "json", "keys", "retire", "nosuchkey", env=database)


def test_a_command_imports_what_it_uses_only() -> None:
    # `providers list` reads settings and the catalog: pydantic, yes; the database, the web stack, ACP, no.
    assert set(imported_by("providers", "list")).isdisjoint(
        {"sqlalchemy", "alembic", "acp", "uvicorn", "httpx", "authlib"}
    )


# -- public_base_url and the listener --------------------------------------------------------------------------


def test_an_unset_public_base_url_follows_a_loopback_listener() -> None:
    assert load_settings(None, env={"CONNECTOR_SERVER__PORT": "8790"}).public_base_url == "http://127.0.0.1:8790"
    assert load_settings(None, env={"CONNECTOR_SERVER__HOST": "::1"}).public_base_url == "http://[::1]:8700"
    # Off loopback the listener's address is no URL a browser uses: 127.0.0.1 and the port, as before.
    assert load_settings(None, env={"CONNECTOR_SERVER__HOST": "0.0.0.0"}).public_base_url == "http://127.0.0.1:8700"  # noqa: S104


def test_a_public_base_url_that_misses_the_loopback_listener_is_warned_at_start(tmp_path: Path) -> None:
    env = {
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path}/c.db",
        "CONNECTOR_SERVER__PORT": "8790",
        "CONNECTOR_PUBLIC_BASE_URL": "http://127.0.0.1:8700",
    }
    ran = cli("migrate", env=env)
    assert ran.code == EXIT_OK
    assert "public_base_url (http://127.0.0.1:8700, set by CONNECTOR_PUBLIC_BASE_URL) names port 8700" in ran.err
    assert "the server listens on 127.0.0.1:8790" in ran.err
    agreeing = cli("migrate", env={**env, "CONNECTOR_PUBLIC_BASE_URL": "http://localhost:8790"})
    assert agreeing.code == EXIT_OK and "names port" not in agreeing.err
    # Behind a proxy or a published port the two differ on purpose: no warning off loopback.
    published = cli("migrate", env={**env, "CONNECTOR_PUBLIC_BASE_URL": "https://connector.example.com"})
    assert published.code == EXIT_OK and "names port" not in published.err
