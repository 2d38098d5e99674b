"""How commands are declared and run: argparse with shared options, one-line errors and exit codes.

A command module calls `commands.command(...)` (or `commands.group(...)` for a command with subcommands) in its
`register(commands)` function and adds its arguments to the parser it gets back; the handler receives an
`Invocation`. Handlers report a problem the operator can fix by raising `CliError` (or a `ConnectorError`);
`service.cli.program` turns it into one line on stderr and an exit code.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

if TYPE_CHECKING:  # the modules behind these are imported when a command needs them, not for `--help`
    from ..config import Settings
    from ..store import Store

T = TypeVar("T")

PROG = "acp-connector"
log = logging.getLogger("service.cli")

EXIT_OK = 0
EXIT_RUNTIME = 1  # the command was right, the world was not: a database, a port, a provider
EXIT_USAGE = 2  # the command line or the configuration is wrong: fix it and run again
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A problem the operator can fix, printed as `acp-connector: <problem> (<fix>)`."""

    def __init__(self, problem: str, fix: str | None = None, *, exit_code: int = EXIT_RUNTIME) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.exit_code = exit_code

    def line(self) -> str:
        return f"{self.problem} ({self.fix})" if self.fix else self.problem


class UsageError(CliError):
    """The command line is wrong (exit code 2)."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem, fix, exit_code=EXIT_USAGE)


@dataclass
class Invocation:
    """One run of one command: its arguments, its environment, where it writes, and its settings on demand."""

    args: argparse.Namespace
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    _settings: Settings | None = None
    log_format: str | None = None  # as configured; None until logging is set up

    @property
    def logs_json(self) -> bool:
        return self.log_format == "json"

    @property
    def debug(self) -> bool:
        return bool(getattr(self.args, "debug", False))

    @property
    def shows_audit(self) -> bool:
        """Whether the audit lines of what the command changes are written beside its output: with --verbose or
        --debug, in JSON mode (stderr is then a log stream) and for `serve` (its stderr is the service's log).
        Recorded in the database (`audit_events`) either way."""
        return bool(getattr(self.args, "verbose", False) or getattr(self.args, "_serves", False)) or (
            self.debug or self.logs_json
        )

    def settings(self) -> Settings:
        """The settings from `--config` (or CONNECTOR_CONFIG) and the environment; logging follows them."""
        if self._settings is None:
            from ..config import load_settings
            from ..config_warnings import report_configuration_warnings

            self._settings = load_settings(getattr(self.args, "config", None), env=self.env)
            self.configure_logging(self._settings.log_format)
            report_configuration_warnings(self._settings)
        return self._settings

    def configure_logging(self, configured: str = "text") -> None:
        """`--log-format` wins over the configured format."""
        from ..logs import configure

        self.log_format = getattr(self.args, "log_format", None) or configured
        configure(self.log_format, debug=self.debug, stream=self.stderr)
        logging.getLogger("service.audit").setLevel(logging.NOTSET if self.shows_audit else logging.WARNING)

    def with_store(self, work: Callable[[Store], Awaitable[T]]) -> T:
        """Run `work` on the configured database (refused unless its schema is current), then close it."""
        import asyncio

        from ..factories import build_store

        settings = self.settings()

        async def run() -> T:
            store = build_store(settings)
            try:
                await store.check_schema()
                return await work(store)
            finally:
                await store.close()

        return asyncio.run(run())

    def out(self, text: str) -> None:
        """Output of the command (stdout), e.g. a table or a key."""
        print(text, file=self.stdout, flush=True)

    def table(self, rows: Sequence[Sequence[str]]) -> None:
        """Rows as aligned columns on stdout (the first row is the header)."""
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.out("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

    def note(self, text: str) -> None:
        """A notice for the operator on stderr: a log record in JSON mode (every line JSON), else a plain line."""
        if self.logs_json:
            log.info(text)
        else:
            print(f"{PROG}: {text}", file=self.stderr, flush=True)

    def report(self, line: str, exit_code: int, **fields: object) -> int:
        """The one line a failed command ends with (a JSON record in JSON mode); returns `exit_code`."""
        line = " ".join(line.split())  # a library's message spanning lines still makes one line
        if self.logs_json:
            log.error(line, extra={"exit_code": exit_code, **fields})
        else:
            print(f"{PROG}: {line}", file=self.stderr, flush=True)
        return exit_code


Handler = Callable[[Invocation], int | None]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs keep their line breaks (examples stay readable)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise `UsageError` (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(_friendlier(message), f"see `{self.prog} --help`")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # Reported by the command they were given to, so the hint points at the right --help.
            path = [
                getattr(parsed, f"_command_{depth}") for depth in range(8) if getattr(parsed, f"_command_{depth}", None)
            ]
            raise UsageError(
                f"unrecognized arguments: {' '.join(extras)}", f"see `{' '.join((self.prog, *path))} --help`"
            )
        return parsed


def _friendlier(message: str) -> str:
    """argparse's "invalid choice" with the nearest valid choice, the rest unchanged."""
    match = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if match is None:
        return message
    what, given, listed = match.groups()
    choices = re.findall(r"'?([\w.-]+)'?", listed)
    kind = "command" if what.isupper() or what.startswith("{") else what
    close = difflib.get_close_matches(given, choices, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"choose from {', '.join(choices)}"
    return f"unknown {kind} '{given}': {hint}"


def port_number(*, lowest: int) -> Callable[[str], int]:
    """An argparse type for a TCP port from `lowest` (0: any free port) to 65535."""

    def parse(text: str) -> int:
        if not text.isdigit() or not lowest <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(f"'{text}' is not a port number ({lowest} to 65535)")
        return int(text)

    return parse


@functools.cache  # argparse copies a parent's actions into each child: one parent serves all 30 subcommands
def common_options(*, suppress: bool) -> Parser:
    """The options every command accepts, before or after its name.

    The top level sets their defaults; each subcommand declares them again with SUPPRESS as default, so a value
    given after the subcommand wins and an absent one does not erase a value given before it.
    """
    parent = Parser(add_help=False)

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parent.add_argument(
        "--config",
        metavar="FILE",
        default=default(None),
        help="connector TOML file (default: $CONNECTOR_CONFIG, else config/connector.toml if present)",
    )
    parent.add_argument(
        "--log-format", choices=["text", "json"], default=default(None), help="log line format (default: log_format)"
    )
    parent.add_argument(
        "--verbose",
        action="store_true",
        default=default(False),
        help="also show the audit lines of what the command changes (always recorded in the database)",
    )
    parent.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="show debug log lines, and a traceback when a command fails unexpectedly",
    )
    return parent


class Commands:
    """The place a command module adds its commands to: the top level, or a group (`providers`, `keys`, ...)."""

    def __init__(self, parser: Parser, path: Sequence[str] = ()) -> None:
        self._parser = parser
        self._path = tuple(path)
        self._names: list[str] = []
        self._subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest=f"_command_{len(path)}")
        parser.set_defaults(_run=self._missing_command)

    def command(self, name: str, run: Handler, *, help: str, description: str, examples: Sequence[str] = ()) -> Parser:
        """Add a command; returns its parser for `add_argument`. `description` says what it does and what it
        reads or changes; `examples` are full command lines shown under its --help."""
        parser = self._add(name, help=help, description=description, examples=examples)
        parser.set_defaults(_run=run)
        return parser

    def group(self, name: str, *, help: str, description: str) -> Commands:
        """Add a command that has subcommands (`acp-connector <name> <subcommand>`)."""
        return Commands(self._add(name, help=help, description=description, examples=()), (*self._path, name))

    def _add(self, name: str, *, help: str, description: str, examples: Sequence[str]) -> Parser:
        if not help.strip() or not description.strip():
            raise ValueError(f"command {' '.join((*self._path, name))} needs a help line and a description")
        epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples) if examples else None
        self._names.append(name)
        parser: Parser = self._subparsers.add_parser(
            name,
            help=help,
            description=description,
            epilog=epilog,
            formatter_class=_Formatter,
            parents=[common_options(suppress=True)],
        )
        return parser

    def _missing_command(self, invocation: Invocation) -> int:
        where = f"{' '.join(self._path)}: " if self._path else ""
        raise UsageError(f"{where}choose a command: {', '.join(self._names)}", f"see `{self._parser.prog} --help`")


def iter_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Parser]]:
    """Every command and group under `parser` with its path, depth first (for help tests and the reference)."""
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from iter_commands(sub, (*path, name))


def new_root_parser(description: str, version: str) -> Parser:
    parser = Parser(
        prog=PROG, description=description, formatter_class=_Formatter, parents=[common_options(suppress=False)]
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version}")
    return parser
