"""The command line as an operator meets it: `make run`'s two steps in an empty directory, and refusals.

Every CLI output these tests see goes through `no_traceback`: without --debug a traceback is never printed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

import service.cli.program
from service.cli import EXIT_RUNTIME, EXIT_USAGE, Commands, Invocation, build_parser, main
from service.cli.framework import iter_commands
from service.version import __version__

from .identity_support import logging_restored

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "service.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def no_traceback(*outputs: str) -> None:
    for output in outputs:
        assert "Traceback" not in output


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def line(self) -> str:
        """The one line an error is reported in."""
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("acp-connector: ")
        return lines[0]


def cli(*argv: str, env: dict[str, str] | None = None) -> Ran:
    """`acp-connector argv...` in this process, with its own stdout/stderr and the given environment."""
    out, err = io.StringIO(), io.StringIO()
    with logging_restored():
        try:
            code = main(list(argv), env=env or {}, stdout=out, stderr=err)
        except SystemExit as exc:  # --help and --version end the program the argparse way
            code = int(exc.code or 0)
    no_traceback(out.getvalue(), err.getvalue())
    return Ran(code, out.getvalue(), err.getvalue())


def scratch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


@pytest.mark.duration(4)
def test_migrate_then_serve_on_loopback_creates_a_dev_key_and_serves(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    port = free_port()
    env = scratch_env(tmp_path, CONNECTOR_SERVER__PORT=str(port), CONNECTOR_PUBLIC_BASE_URL=f"http://127.0.0.1:{port}")
    migrated = subprocess.run([*CLI, "migrate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    server = subprocess.Popen(
        [*CLI, "--log-format", "json", "serve"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        ready = None
        deadline = time.monotonic() + 90  # a loaded CI machine: a start is seconds, the deadline only ends a hang
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert ready is not None and ready.status_code == 200 and ready.json() == {"status": "ready"}
        page = httpx.get(f"http://127.0.0.1:{port}/connect/unknown-id", timeout=5)
        assert page.status_code == 404 and page.headers["x-connector-error"] == "unknown_elicitation"
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=20)
    key_file = tmp_path / "var" / "vault.keys"
    assert key_file.is_file() and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # With --log-format json every line is one JSON object: the CLI's notices, uvicorn's lines, the access log.
    records = [json.loads(line) for line in stderr.splitlines() if line]
    assert any("created a development key file at var/vault.keys" in r["message"] for r in records)
    access = [r for r in records if r["logger"] == "uvicorn.access" and r["path"] == "/readyz"]
    assert access and access[0]["status"] == 200 and access[0]["request_id"] == ready.headers["x-request-id"]
    assert key_file.read_text().split(":", 1)[1].strip()[:16] not in stderr  # the key itself is never printed
    no_traceback(migrated.stderr, stderr)


def test_serve_refuses_an_unmigrated_database_and_says_what_to_run(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    result = subprocess.run(
        [*CLI, "serve"], cwd=tmp_path, env=scratch_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1  # a runtime problem: the command was right, the database is not ready
    assert "acp-connector migrate" in result.stderr and "Traceback" not in result.stderr


def test_non_loopback_deployment_without_a_key_is_refused(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    env = scratch_env(tmp_path, CONNECTOR_PUBLIC_BASE_URL="https://connector.example.com")
    result = subprocess.run([*CLI, "serve"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    no_traceback(result.stderr)
    assert "vault.keys" in result.stderr and "not a loopback deployment" in result.stderr
    assert not (tmp_path / "var" / "vault.keys").exists()
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_invalid_setting_is_one_line_naming_key_and_file(tmp_path: Path) -> None:
    config = tmp_path / "connector.toml"
    config.write_text("[elicitation]\nttl_seconds = -5\n")
    result = subprocess.run(
        [*CLI, "--config", str(config), "migrate"],
        cwd=tmp_path,
        env=scratch_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    no_traceback(result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert str(config) in line and "elicitation.ttl_seconds" in line


# -- options, help, version ------------------------------------------------------------------------------------


def test_options_work_before_or_after_the_command(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    before = parse(["--config", "a.toml", "--log-format", "json", "--debug", "keys", "generate", "--key-id", "k1"])
    after = parse(["keys", "generate", "--key-id", "k1", "--config", "a.toml", "--log-format", "json", "--debug"])
    between = parse(["keys", "--config", "a.toml", "generate", "--log-format", "json", "--debug", "--key-id", "k1"])
    assert vars(before) == vars(after) == vars(between)
    # A value given before the command is not erased by the command's own (absent) option, and after wins.
    assert parse(["--config", "a.toml", "migrate"]).config == "a.toml"
    assert parse(["--config", "a.toml", "migrate", "--config", "b.toml"]).config == "b.toml"
    # And on a real command: each spelling migrates the database its config file names.
    for index, argv in enumerate((["--config", "{f}", "migrate"], ["migrate", "--config", "{f}"])):
        config = tmp_path / f"c{index}.toml"
        config.write_text(f'[database]\nurl = "sqlite+aiosqlite:///{tmp_path / f"db{index}.sqlite"}"\n')
        ran = cli(*(arg.format(f=config) for arg in argv))
        assert ran.code == 0, ran.err
        assert (tmp_path / f"db{index}.sqlite").is_file()


COMMANDS = sorted(path for path, _ in iter_commands(build_parser()))


def test_the_command_tree_is_what_the_reference_names() -> None:
    assert {"serve", "migrate", "providers list", "keys generate", "mock-provider"} <= {" ".join(p) for p in COMMANDS}


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_has_real_help(path: tuple[str, ...]) -> None:
    ran = cli(*path, "--help")
    assert ran.code == 0 and ran.err == ""
    usage, _, rest = ran.out.partition("\n\n")
    assert usage.startswith(f"usage: acp-connector {' '.join(path)} ")
    description = rest.split("\n\n", 1)[0]
    assert len(description.split()) >= 8, f"`{' '.join(path)} --help` explains too little: {description!r}"
    assert "--config" in ran.out  # the shared options are accepted (and listed) after every command


def test_version_is_the_installed_package_version() -> None:
    ran = cli("--version")
    assert ran.code == 0 and ran.out.strip() == f"acp-connector {__version__}"
    assert __version__ not in ("", "0+unknown")


# -- errors: one line, the problem and the fix, exit 2 for usage and 1 for runtime ------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "choose a command: serve, migrate"),
        (["serv"], "unknown command 'serv': did you mean 'serve'?"),
        (["keys"], "keys: choose a command: generate"),
        (["keys", "generate", "--key-id", "not a key id"], "invalid --key-id 'not a key id' (use letters"),
        (["keys", "generate", "--bogus"], "unrecognized arguments: --bogus (see `acp-connector keys generate --help`)"),
        (["migrate", "--log-format", "xml"], "unknown --log-format 'xml': choose from text, json"),
        (["mock-provider", "--port", "eighty"], "'eighty' is not a port number (0 to 65535)"),
    ],
)
def test_usage_errors_are_one_line_with_the_fix_and_exit_2(argv: list[str], says: str) -> None:
    ran = cli(*argv)
    assert ran.code == EXIT_USAGE and ran.out == ""
    assert says in ran.line
    assert "--help" in ran.line or "use " in ran.line  # the fix


def test_an_unreachable_database_is_a_runtime_error_naming_the_database(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql+asyncpg://connector:s3cret-password@127.0.0.1:{port}/connector"
    ran = cli("migrate", env={"CONNECTOR_DATABASE__URL": url})
    assert ran.code == EXIT_RUNTIME
    assert f"cannot open the database at postgresql+asyncpg://connector@127.0.0.1:{port}/connector" in ran.line
    assert "check database.url" in ran.line and "s3cret-password" not in ran.err
    (tmp_path / "a-file").write_text("")
    ran = cli("migrate", env={"CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path}/a-file/connector.db"})
    assert ran.code == EXIT_RUNTIME and "cannot open the database" in ran.line


def test_an_unsupported_database_url_is_a_config_error_without_the_password() -> None:
    ran = cli("migrate", env={"CONNECTOR_DATABASE__URL": "mysql://connector:s3cret-password@db/connector"})
    assert ran.code == EXIT_USAGE
    assert "database.url: unsupported database 'mysql'" in ran.line and "CONNECTOR_DATABASE__URL" in ran.line
    assert "s3cret-password" not in ran.err


def test_an_unexpected_error_is_one_line_and_debug_shows_where(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(invocation: Invocation) -> int:
        raise RuntimeError("the disk is on fire")

    def register(commands: Commands) -> None:
        commands.command("explode", explode, help="fail", description="Fail in a way no handler expects, for tests.")

    monkeypatch.setattr(service.cli.program, "COMMAND_MODULES", (SimpleNamespace(register=register),))
    ran = cli("explode")
    assert ran.code == EXIT_RUNTIME
    assert ran.line == (
        "acp-connector: unexpected error: RuntimeError: the disk is on fire "
        "(run again with --debug to see where it happened)"
    )
    out, err = io.StringIO(), io.StringIO()
    with logging_restored():
        assert main(["explode", "--debug"], env={}, stdout=out, stderr=err) == EXIT_RUNTIME
    assert "Traceback (most recent call last)" in err.getvalue() and "in explode" in err.getvalue()
