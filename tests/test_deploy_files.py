"""Dockerfile and docker-compose.yml, checked without a Docker engine: what they copy exists, what they run is a
real command of ours, and the environment they give the connector loads as valid settings."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from service import ConfigError, Connector, load_settings
from service.cli import build_parser
from service.vault import generate_key

ROOT = Path(__file__).resolve().parent.parent


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile_copies_files_that_exist_and_runs_our_command() -> None:
    instructions = dockerfile_instructions()
    for op, args in instructions:
        if op == "COPY" and not args.startswith("--from"):
            *sources, _dest = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repository"
    entrypoint = next(args for op, args in instructions if op == "ENTRYPOINT")
    cmd = next(args for op, args in instructions if op == "CMD")
    assert yaml.safe_load(entrypoint) == ["acp-connector"]
    build_parser().parse_args(yaml.safe_load(cmd))  # a real subcommand
    assert any(op == "USER" and args != "root" for op, args in instructions)


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def interpolate(value: str, env: dict[str, str]) -> str:
    """docker compose's ${VAR}, ${VAR:-default} and ${VAR:?message}."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        present = env.get(name)
        if op == ":?" and not present:
            raise KeyError(f"{name}: {arg}")
        if op == ":-" and not present:
            return arg
        return present or ""

    return re.sub(r"\$\{([A-Z0-9_]+)(?:(:[-?])([^}]*))?\}", one, value)


OPERATOR_ENV = {
    "CONNECTOR_PUBLIC_BASE_URL": "https://connector.example.com",
    "CONNECTOR_VAULT__KEYS": generate_key("k1"),
    "CONNECTOR_IDENTITY__VERIFIER": "trusted_header",
    "CONNECTOR_SERVER__TRUSTED_PROXIES": "10.0.0.0/8",
    "CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": "https://sso.example.com",
}


def connector_env(service: str, operator_env: dict[str, str]) -> dict[str, str]:
    raw = compose()["services"][service]["environment"]
    env = {key: interpolate(str(value), operator_env) for key, value in raw.items()}
    env.update(
        {
            "CONNECTOR_SERVER__HOST": "0.0.0.0",  # noqa: S104 - as the Dockerfile sets it
            "CONNECTOR_CONFIG": str(ROOT / "config/connector.toml"),
        }
    )
    return {k: v for k, v in env.items() if v != ""}


@pytest.mark.parametrize("service", ["migrate", "connector"])
async def test_compose_services_run_real_commands_with_valid_settings(service: str) -> None:
    spec = compose()["services"][service]
    build_parser().parse_args(spec["command"])
    settings = load_settings(env=connector_env(service, OPERATOR_ENV))
    assert settings.database.url.startswith("postgresql+asyncpg://")
    assert settings.identity.verifier == "trusted_header"
    assert not settings.is_loopback_deployment
    # Everything the container builds at start (key ring, catalog, verifier) comes together from that environment.
    connector = Connector.from_settings(settings)
    await connector.close()


def test_compose_refuses_to_start_without_a_verifier_choice_or_key() -> None:
    for missing in ("CONNECTOR_IDENTITY__VERIFIER", "CONNECTOR_VAULT__KEYS", "CONNECTOR_PUBLIC_BASE_URL"):
        env = {k: v for k, v in OPERATOR_ENV.items() if k != missing}
        with pytest.raises(KeyError, match=missing):
            connector_env("connector", env)


def test_compose_with_the_local_verifier_is_refused_by_the_connector() -> None:
    settings = load_settings(env=connector_env("connector", {**OPERATOR_ENV, "CONNECTOR_IDENTITY__VERIFIER": "local"}))
    with pytest.raises(ConfigError, match=r"identity\.verifier"):
        Connector.from_settings(settings)


def test_every_variable_of_the_compose_file_is_documented_and_is_a_setting() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    guide = (ROOT / "docs" / "sidecar.md").read_text()
    sidecar = guide[guide.index("## With Docker") : guide.index("## The API")]
    documented = set(re.findall(r"`(CONNECTOR_[A-Z0-9_]+)`", sidecar))
    # `__CLIENT_ID`-style continuations in a row name variables with the prefix of the row's first variable.
    for row in re.findall(r"^\| (`CONNECTOR_[^|]+)\|", sidecar, re.M):
        first, *rest = re.findall(r"`([A-Z0-9_]+)`", row)
        documented.update(first[: first.rindex("__")] + part for part in rest if part.startswith("__"))
    interpolated = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    passed = {key for service in compose()["services"].values() for key in (service.get("environment") or {})}
    passed = {key for key in passed if key.startswith("CONNECTOR_")}
    assert interpolated | passed <= documented, sorted((interpolated | passed) - documented)
    # Every CONNECTOR_* the connector receives is a setting it knows (or a provider credential), not a typo.
    env = connector_env("connector", {**OPERATOR_ENV, "CONNECTOR_API__ENABLED": "false", "CONNECTOR_AGENT_NAME": "X"})
    settings = load_settings(env=env)
    assert settings.api.enabled is False and settings.agent_name == "X"
    for key in passed:
        section = key.removeprefix("CONNECTOR_").lower().split("__")
        if key.startswith("CONNECTOR_PROVIDER_") or key == "CONNECTOR_DB_PASSWORD":
            continue
        assert section[0] in type(settings).model_fields, key
