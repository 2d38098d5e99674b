"""The `acp-connector` command line. One module per command group; `program.COMMAND_MODULES` lists them."""

from .framework import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, CliError, Commands, Invocation, UsageError
from .program import build_parser, main, run

__all__ = [
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "CliError",
    "Commands",
    "Invocation",
    "UsageError",
    "build_parser",
    "main",
    "run",
]
