"""`acp-connector`: parse, run one command, and turn every failure into one line and an exit code.

Exit codes: 0 done, 1 a runtime problem (database, port, provider), 2 a usage or configuration problem,
130 interrupted. Without `--debug` no traceback is ever printed.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from types import ModuleType
from typing import TextIO

from ..core.errors import ConfigError, ConnectorError, VaultError
from ..version import __version__
from . import api_keys, audit, elicitations, grants, keys, migrate, mock_provider, providers, purge, serve, webhooks
from .framework import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    PROG,
    CliError,
    Commands,
    Invocation,
    Parser,
    log,
    new_root_parser,
)

# Each module registers its commands (`register(commands)`); a new command group is a new module listed here.
COMMAND_MODULES: tuple[ModuleType, ...] = (
    serve,
    migrate,
    purge,
    providers,
    keys,
    grants,
    elicitations,
    audit,
    api_keys,
    webhooks,
    mock_provider,
)

DESCRIPTION = """\
The ACP OAuth connector: lets an ACP agent obtain a user's authorization at a third-party provider (GitHub,
Google, ...) through URL-mode elicitation, keeping every token server-side and encrypted.

Options may come before or after the command. Settings come from the TOML file (--config) and CONNECTOR_*
environment variables; `acp-connector COMMAND --help` explains each command."""


def build_parser() -> Parser:
    parser = new_root_parser(DESCRIPTION, __version__)
    commands = Commands(parser)
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        with redirect_stdout(out), redirect_stderr(err):  # --help and --version print through argparse
            args = build_parser().parse_args(argv)
    except CliError as exc:
        return _report(err, exc.line(), exc.exit_code)
    invocation = Invocation(args, env=dict(os.environ if env is None else env), stdout=out, stderr=err)
    try:
        invocation.configure_logging()
        return invocation.args._run(invocation) or EXIT_OK
    except CliError as exc:
        return invocation.report(exc.line(), exc.exit_code)
    except ConfigError as exc:
        return invocation.report(f"config error: {exc}", EXIT_USAGE, code=exc.code)
    except VaultError as exc:
        return invocation.report(f"{exc.code}: {exc}", EXIT_USAGE, code=exc.code)
    except ConnectorError as exc:  # SchemaNotCurrent, DatabaseUnavailable, ...: the world, not the command line
        return invocation.report(f"{exc.code}: {exc}", EXIT_RUNTIME, code=exc.code)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`... | head`): nothing to say, and nowhere to say it
        _silence(out)
        return EXIT_RUNTIME
    except Exception as exc:
        if invocation.debug and invocation.logs_json:
            log.error("unexpected error: %s", type(exc).__name__, exc_info=exc, extra={"exit_code": EXIT_RUNTIME})
            return EXIT_RUNTIME
        if invocation.debug:
            traceback.print_exc(file=err)
            return EXIT_RUNTIME
        return invocation.report(
            f"unexpected error: {type(exc).__name__}: {exc} (run again with --debug to see where it happened)",
            EXIT_RUNTIME,
        )


def _silence(stream: TextIO) -> None:
    """Point a broken stream at /dev/null, so flushing it at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):  # not a real file (a test's StringIO)
        pass


def _report(err: TextIO, line: str, code: int) -> int:
    print(f"{PROG}: {' '.join(line.split())}", file=err, flush=True)
    return code


def run() -> None:
    """The console script."""
    sys.exit(main())


__all__ = ["build_parser", "main", "run"]
