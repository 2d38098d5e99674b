"""docs/reference.md, generated from the code: every setting and environment variable, error code, audit event and
command. `make reference` writes it; tests/test_reference.py fails when the file and the code disagree.

    python -m service.reference > docs/reference.md
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .cli import build_parser
from .cli.framework import iter_commands
from .config import (
    CONFIG_ENV_VAR,
    field_description,
    setting_description,
    setting_env_var,
    setting_field,
    setting_paths,
)
from .core.audit_events import AUDIT_EVENTS
from .identity import registry as verifiers
from .providers import PROVIDER_ENV_SUFFIXES
from .web.errors import REFUSALS

PROVIDER_VARIABLES = {
    "CLIENT_ID": "the OAuth client id registered at the provider",
    "CLIENT_SECRET": "its client secret (never in a file)",
    "DISCOVERY_URL": "the provider's discovery document, for entries resolved from it (e.g. `oidc`)",
    "TENANT": "the Microsoft Entra tenant (id or domain) for the `microsoft` entry",
}
HEADER = """\
# Reference

Generated from the code by `make reference` (`python -m service.reference`); do not edit by hand:
`tests/test_reference.py` fails when this file and the code disagree. Where each setting comes from and how to
choose values: README.md and the comments in `config/connector.toml`.
"""


def render() -> str:
    parts = [HEADER, _settings(), _verifier_settings(), _other_variables(), _errors(), _audit(), _commands()]
    return "\n".join(parts).rstrip() + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows)
    return "\n".join(lines) + "\n"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        # Sorted: equal Literals are one cached object in typing, so the order is that of whichever module (ours, or
        # a library's: mcp names the same four token endpoint methods) spelled it first in the process.
        return " or ".join(f"`{value}`" for value in sorted(args, key=str))
    if origin in (typing.Union, types.UnionType):
        named = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" (optional)" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type):
        return {"str": "text", "int": "integer", "float": "number", "bool": "boolean", "Path": "path"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None or value == []:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _settings() -> str:
    rows = [
        (
            f"`{'.'.join(path)}`",
            f"`{setting_env_var(path)}`",
            _type_name(field.annotation),
            _default(field),
            setting_description(path),
        )
        for path in setting_paths()
        for field in (setting_field(path),)
    ]
    return "## Settings\n\n" + _table(("key", "environment variable", "type", "default", "meaning"), rows)


def _verifier_settings() -> str:
    sections = ["## Identity verifier settings\n\nEach verifier reads its own `[identity.<name>]` table.\n"]
    for name, plugin in sorted(verifiers.plugins().items()):
        model: type[BaseModel] = plugin.settings_model
        rows = [
            (
                f"`identity.{name}.{key}`",
                f"`{setting_env_var(('identity', name, key))}`",
                _type_name(field.annotation),
                _default(field),
                field_description(model, key),
            )
            for key, field in model.model_fields.items()
        ]
        doc = " ".join((model.__doc__ or "").split())
        sections.append(
            f"### `{name}`\n\n{doc}\n\n" + _table(("key", "environment variable", "type", "default", "meaning"), rows)
        )
    return "\n".join(sections)


def _other_variables() -> str:
    rows = [(f"`{CONFIG_ENV_VAR}`", "the config file (default: `config/connector.toml` when it exists)")]
    rows += [(f"`CONNECTOR_PROVIDER_<NAME>_{suffix}`", meaning) for suffix, meaning in PROVIDER_VARIABLES.items()]
    rows += [
        ("`CONNECTOR_PROVIDERS__<NAME>__<KEY>`", "a key of the catalog entry `<name>` (overrides providers.toml)"),
        ("`CONNECTOR_TEST_*`", "reserved for test suites; never read as settings and never warned about"),
    ]
    missing = set(PROVIDER_ENV_SUFFIXES) - set(PROVIDER_VARIABLES)
    if missing:
        raise RuntimeError(f"service/reference.py: describe CONNECTOR_PROVIDER_<NAME>_{sorted(missing)}")
    return "## Other environment variables\n\n" + _table(("variable", "meaning"), rows)


def _errors() -> str:
    rows = [
        (f"`{code}`", str(refusal.status), refusal.title, refusal.sentence.replace("{", "<").replace("}", ">"))
        for code, refusal in sorted(REFUSALS.items())
    ]
    intro = (
        "Every refusal has a stable code: the `X-Connector-Error` header of a page, the `error` of a JSON answer "
        "under `/v1/`. `<name>` in a sentence is filled from the refusal's detail.\n\n"
    )
    return "## Error codes\n\n" + intro + _table(("code", "HTTP status", "page title", "what the person reads"), rows)


def _audit() -> str:
    intro = (
        "Each is a row in `audit_events` and one line on the `service.audit` logger (`audit_event`, "
        "`elicitation_id`, `provider`, `identity_issuer`, `identity_subject`, `detail`). The registry is "
        "`service/core/audit_events.py`.\n\n"
    )
    rows = [(f"`{name}`", meaning) for name, meaning in sorted(AUDIT_EVENTS.items())]
    return "## Audit events\n\n" + intro + _table(("event", "meaning"), rows)


def _commands() -> str:
    rows = [
        (f"`acp-connector {' '.join(path)}`", parser.description.split("\n\n")[0] if parser.description else "")
        for path, parser in iter_commands(build_parser())
    ]
    intro = (
        "Options (`--config`, `--log-format`, `--verbose`, `--debug`) go before or after the command; each has "
        "`--help`.\n\n"
    )
    return "## Commands\n\n" + intro + _table(("command", "what it does"), rows)


def write(path: Path) -> None:
    path.write_text(render())


if __name__ == "__main__":
    sys.stdout.write(render())
