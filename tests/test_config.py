"""Settings loading: sources and their precedence, validation, error messages and secrecy."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from service import Connector, Identity, ProviderNotConfigured, SessionScope
from service.cli import main
from service.config import (
    DatabaseSettings,
    ServerSettings,
    Settings,
    load_settings,
)
from service.config_warnings import configuration_warnings
from service.core.errors import ConfigError
from service.core.urls import is_loopback_host
from service.vault import generate_key

from .identity_support import logging_restored

REPO = Path(__file__).resolve().parent.parent
SECRET_KEY = "k1:c2VjcmV0LWtleS1tYXRlcmlhbC0zMi1ieXRlcy1sb25nISE"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory without config/connector.toml."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


# --- choosing the file -------------------------------------------------------------------------------


def test_no_file_gives_defaults(empty_cwd: Path) -> None:
    settings = load_settings(env={})
    assert settings.config_file is None
    assert settings.public_base_url == "http://127.0.0.1:8700"
    assert settings.agent_name == "ACP agent"
    assert settings.log_format == "text"
    assert settings.server == ServerSettings(host="127.0.0.1", port=8700)
    assert settings.database == DatabaseSettings(url="sqlite+aiosqlite:///./var/connector.db")
    assert settings.elicitation.ttl_seconds == 600
    assert settings.identity.verifier == "local"
    assert settings.identity.section("local") == {}
    assert settings.vault.keys == []
    assert settings.vault.key_file is None
    assert settings.vault.primary_key_id is None
    assert settings.providers.catalog == Path("providers.toml")


def test_default_path_is_used_when_present(empty_cwd: Path) -> None:
    write(empty_cwd / "config" / "connector.toml", 'agent_name = "From default path"\n')
    settings = load_settings(env={})
    assert settings.agent_name == "From default path"
    assert settings.config_file == (empty_cwd / "config" / "connector.toml").resolve()


def test_connector_config_env_chooses_the_file(empty_cwd: Path, tmp_path: Path) -> None:
    write(empty_cwd / "config" / "connector.toml", 'agent_name = "default path"\n')
    chosen = write(tmp_path / "elsewhere.toml", 'agent_name = "chosen by env"\n')
    settings = load_settings(env={"CONNECTOR_CONFIG": str(chosen)})
    assert settings.agent_name == "chosen by env"
    assert settings.config_file == chosen.resolve()


def test_explicit_path_beats_connector_config(tmp_path: Path) -> None:
    explicit = write(tmp_path / "a.toml", 'agent_name = "explicit"\n')
    other = write(tmp_path / "b.toml", 'agent_name = "env"\n')
    assert load_settings(explicit, env={"CONNECTOR_CONFIG": str(other)}).agent_name == "explicit"


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_settings(missing, env={})
    assert caught.value.file == str(missing)
    assert "not found" in caught.value.problem


def test_missing_file_named_by_connector_config_is_an_error(empty_cwd: Path, tmp_path: Path) -> None:
    missing = tmp_path / "gone.toml"
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONNECTOR_CONFIG": str(missing)})
    assert caught.value.file == str(missing)
    assert "CONNECTOR_CONFIG" in caught.value.problem


def test_shipped_config_loads_and_points_at_the_shipped_catalog() -> None:
    settings = load_settings(REPO / "config" / "connector.toml", env={})
    defaults = Settings()
    assert settings.public_base_url == defaults.public_base_url
    assert settings.server == defaults.server
    assert settings.database == defaults.database
    assert settings.elicitation == defaults.elicitation
    assert (settings.identity.verifier, settings.identity.max_mismatches) == ("local", 3)
    assert settings.providers.catalog == REPO / "config" / "providers.toml"
    assert settings.providers.catalog.is_file()
    assert settings.vault.key_file is None  # no key file by default: serve makes a dev key on loopback only
    assert settings.is_loopback_deployment


# --- precedence ----------------------------------------------------------------------------------------


def test_file_overrides_defaults_and_env_overrides_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        agent_name = "From file"
        [server]
        host = "127.0.0.2"
        port = 9000
        [elicitation]
        ttl_seconds = 30
        """,
    )
    settings = load_settings(path, env={"CONNECTOR_SERVER__PORT": "9100", "CONNECTOR_AGENT_NAME": "From env"})
    assert settings.server.port == 9100  # env wins
    assert settings.server.host == "127.0.0.2"  # same section, not set in env: the file's value survives
    assert settings.agent_name == "From env"
    assert settings.elicitation.ttl_seconds == 30  # file beats default
    assert settings.log_format == "text"  # default


def test_env_names_are_case_insensitive_and_empty_values_ignored(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[server]\nport = 9000\n")
    settings = load_settings(path, env={"connector_log_format": "json", "CONNECTOR_SERVER__PORT": ""})
    assert settings.log_format == "json"
    assert settings.server.port == 9000


def test_process_environment_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "c.toml", "[elicitation]\nttl_seconds = 30\n")
    monkeypatch.setenv("CONNECTOR_ELICITATION__TTL_SECONDS", "45")
    assert load_settings(path).elicitation.ttl_seconds == 45


def test_given_env_mapping_replaces_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "c.toml", "[elicitation]\nttl_seconds = 30\n")
    monkeypatch.setenv("CONNECTOR_ELICITATION__TTL_SECONDS", "45")
    assert load_settings(path, env={}).elicitation.ttl_seconds == 30


def test_database_url_from_env(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[database]\nurl = "sqlite+aiosqlite:///./x.db"\n')
    url = "postgresql+asyncpg://connector@db:5432/connector"
    assert load_settings(path, env={"CONNECTOR_DATABASE__URL": url}).database.url == url


# --- errors ----------------------------------------------------------------------------------------------


def test_bad_value_in_file_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[elicitation]\nttl_seconds = -5\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    error = caught.value
    assert error.file == str(path)
    assert error.key == "elicitation.ttl_seconds"
    assert "greater than 0" in error.problem
    assert str(error).startswith(f"{path}: elicitation.ttl_seconds: ")
    assert error.code == "config_error"


def test_bad_value_from_env_names_key_and_variable(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[elicitation]\nttl_seconds = 30\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={"CONNECTOR_ELICITATION__TTL_SECONDS": "0"})
    error = caught.value
    assert error.file == "environment"
    assert error.key == "elicitation.ttl_seconds"
    assert "CONNECTOR_ELICITATION__TTL_SECONDS" in error.problem


def test_non_integer_from_env(empty_cwd: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONNECTOR_SERVER__PORT": "eighty"})
    assert caught.value.key == "server.port"
    assert "CONNECTOR_SERVER__PORT" in caught.value.problem
    assert "eighty" not in str(caught.value)


def test_unparseable_json_section_from_env(empty_cwd: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONNECTOR_SERVER": "{not json"})
    assert caught.value.file == "environment"
    assert caught.value.key == "server"
    assert "CONNECTOR_SERVER" in caught.value.problem


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nport = 0\n", "server.port"),
        ("[server]\nport = 65536\n", "server.port"),
        ('[server]\nport = "http"\n', "server.port"),
        ('log_format = "xml"\n', "log_format"),
        ('agent_name = ""\n', "agent_name"),
    ],
)
def test_invalid_values_are_refused(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.key == key
    assert caught.value.file == str(path)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("servr = 1\n", "servr", "unknown key: did you mean 'server'?"),
        ("[server]\nprot = 8000\n", "server.prot", "unknown key: did you mean 'port'?"),
        ("[vault]\nkeyfile = 'x'\n", "vault.keyfile", "unknown key: did you mean 'key_file'?"),
        ("[identity]\nverifer = 'oidc'\n", "identity.verifer", "unknown key: did you mean 'verifier'?"),
        ("[database]\nxyzzy = 1\n", "database.xyzzy", "unknown key"),
    ],
)
def test_unknown_keys_are_refused_naming_the_nearest_valid_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.file == str(path)
    assert caught.value.key == key
    assert caught.value.problem == problem


def test_a_misspelt_identity_key_from_env_is_refused_naming_the_variable(empty_cwd: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONNECTOR_IDENTITY__VERIFER": "oidc"})
    assert caught.value.key == "identity.verifer"
    assert caught.value.problem == "unknown key: did you mean 'verifier'? (set by CONNECTOR_IDENTITY__VERIFER)"


def test_unknown_environment_variables_are_reported_with_the_nearest_setting(empty_cwd: Path) -> None:
    catalog = write(empty_cwd / "providers.toml", "[github]\nauthorization_endpoint = 'https://github.com/a'\n")
    env = {
        "CONNECTOR_PUBLIC_URL": "https://connector.example.com",  # a typo of CONNECTOR_PUBLIC_BASE_URL
        "CONNECTOR_PROVIDER_GITHUB_CLIENTID": "x",  # of CONNECTOR_PROVIDER_GITHUB_CLIENT_ID
        "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": "s",  # known: a catalog entry's credential
        "CONNECTOR_IDENTITY__OIDCC__ISSUER": "https://idp.example.com",  # no verifier "oidcc"
        "CONNECTOR_IDENTITY__OIDC__DISCOVERY_ULR": "https://idp.example.com",  # oidc has discovery_url
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_SERVER__PORT": "8700",
        "CONNECTOR_VAULT__KEYS": SECRET_KEY,
        "CONNECTOR_CONFIG": "",
        "CONNECTOR_TEST_ANYTHING": "test suites keep their own variables",
        "CONNECTOR_WHOLLY_UNRELATED": "1",
    }
    warnings = dict(configuration_warnings(load_settings(env=env)))
    assert warnings == {
        "CONNECTOR_PUBLIC_URL": "environment variable CONNECTOR_PUBLIC_URL is not a setting and is ignored: "
        "did you mean CONNECTOR_PUBLIC_BASE_URL?",
        "CONNECTOR_PROVIDER_GITHUB_CLIENTID": "environment variable CONNECTOR_PROVIDER_GITHUB_CLIENTID is not a "
        "setting and is ignored: did you mean CONNECTOR_PROVIDER_GITHUB_CLIENT_ID?",
        "CONNECTOR_WHOLLY_UNRELATED": "environment variable CONNECTOR_WHOLLY_UNRELATED is not a setting and is "
        "ignored (see docs/reference.md)",
        "identity.oidcc": "CONNECTOR_IDENTITY__OIDCC__ISSUER: identity.oidcc: no verifier has this name, ignored: "
        "did you mean [identity.oidc]?",
        "identity.oidc.discovery_ulr": "CONNECTOR_IDENTITY__OIDC__DISCOVERY_ULR: identity.oidc.discovery_ulr: "
        "unknown key: did you mean 'discovery_url'?",
    }


def test_the_cli_warns_about_unknown_variables_once(empty_cwd: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with logging_restored():
        code = main(["migrate", "--log-format", "json"], env={"CONNECTOR_PUBLIC_URL": "x"}, stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    records = [json.loads(line) for line in err.getvalue().splitlines()]
    (warning,) = [r for r in records if r["level"] == "warning"]
    assert warning["logger"] == "service.config" and warning["config_key"] == "CONNECTOR_PUBLIC_URL"
    assert "did you mean CONNECTOR_PUBLIC_BASE_URL?" in warning["message"]


async def test_the_given_environment_governs_provider_credentials(
    empty_cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials in the process environment do not count when `load_settings(env=...)` is given, and vice versa."""
    catalog = write(
        empty_cwd / "providers.toml",
        "[github]\nauthorization_endpoint = 'https://github.com/a'\ntoken_endpoint = 'https://github.com/t'\n",
    )
    monkeypatch.setenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_ID", "from-process")
    monkeypatch.setenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET", "from-process")
    base = {"CONNECTOR_PROVIDERS__CATALOG": str(catalog), "CONNECTOR_VAULT__KEYS": generate_key("k1")}
    without = Connector.from_settings(load_settings(env=base))
    try:
        with pytest.raises(ProviderNotConfigured):
            await without.request_authorization(
                None, user=Identity("i", "s"), provider="github", scope=SessionScope("x")
            )
    finally:
        await without.close()
    out = io.StringIO()
    with logging_restored():
        assert main(["providers", "list"], env=base, stdout=out, stderr=io.StringIO()) == 0
    assert "unconfigured: set CONNECTOR_PROVIDER_GITHUB_CLIENT_ID" in out.getvalue()
    given = {**base, "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": "id", "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": "s"}
    monkeypatch.delenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_ID")
    monkeypatch.delenv("CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET")
    out = io.StringIO()
    with logging_restored():
        assert main(["providers", "list"], env=given, stdout=out, stderr=io.StringIO()) == 0
    assert "github" in out.getvalue() and " configured" in out.getvalue()


def test_unknown_nested_key_from_env_is_refused(empty_cwd: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONNECTOR_SERVER__PROT": "8000"})
    assert caught.value.key == "server.prot"
    assert "CONNECTOR_SERVER__PROT" in caught.value.problem


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", 'agent_name = "ok"\n[server\nport = 1\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.file == str(path)
    assert caught.value.key == "<toml>"
    assert "line 2" in caught.value.problem


def test_config_file_key_is_not_read_from_toml(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", 'config_file = "/etc/other.toml"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.key == "config_file"


def test_vault_keys_in_toml_are_refused_without_echoing_them(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", f'[vault]\nkeys = ["{SECRET_KEY}"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.file == str(path)
    assert caught.value.key == "vault.keys"
    assert "key_file" in caught.value.problem
    assert SECRET_KEY.split(":")[1] not in str(caught.value)


# --- public_base_url ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("https://connector.example.com", "https://connector.example.com"),
        ("https://connector.example.com/", "https://connector.example.com"),
        ("https://example.com/connector/", "https://example.com/connector"),
        ("http://127.0.0.1:8700", "http://127.0.0.1:8700"),
        ("http://127.9.8.7:1234/", "http://127.9.8.7:1234"),
        ("http://localhost:8700", "http://localhost:8700"),
        ("http://[::1]:8700", "http://[::1]:8700"),
    ],
)
def test_public_base_url_accepted(empty_cwd: Path, given: str, expected: str) -> None:
    assert load_settings(env={"CONNECTOR_PUBLIC_BASE_URL": given}).public_base_url == expected


@pytest.mark.parametrize(
    ("given", "fragment_of_problem"),
    [
        ("http://connector.example.com", "https"),
        ("http://10.0.0.5:8700", "https"),
        ("http://0.0.0.0:8700", "https"),
        ("https://example.com/?next=1", "query"),
        ("https://example.com/#top", "fragment"),
        ("ftp://example.com", "http(s)"),
        ("connector.example.com", "http(s)"),
        ("https://user:pw@example.com", "credentials"),
        ("https://example.com:99999", "valid URL"),
    ],
)
def test_public_base_url_refused(tmp_path: Path, given: str, fragment_of_problem: str) -> None:
    path = write(tmp_path / "c.toml", f'public_base_url = "{given}"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert caught.value.key == "public_base_url"
    assert caught.value.file == str(path)
    assert fragment_of_problem in caught.value.problem
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("host", "public", "expected"),
    [
        ("127.0.0.1", "http://127.0.0.1:8700", True),
        ("localhost", "http://localhost:8700", True),
        ("::1", "http://[::1]:8700", True),
        ("0.0.0.0", "http://127.0.0.1:8700", False),  # noqa: S104 - a value under test
        ("127.0.0.1", "https://connector.example.com", False),
    ],
)
def test_is_loopback_deployment(empty_cwd: Path, host: str, public: str, expected: bool) -> None:
    env = {"CONNECTOR_SERVER__HOST": host, "CONNECTOR_PUBLIC_BASE_URL": public}
    assert load_settings(env=env).is_loopback_deployment is expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),  # noqa: S104 - a value under test
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback_host(host: str | None, expected: bool) -> None:
    assert is_loopback_host(host) is expected


# --- vault keys and secrecy --------------------------------------------------------------------------------


def test_vault_keys_from_env_comma_separated_or_json(empty_cwd: Path) -> None:
    other = "k0:b2xkZXIta2V5LW1hdGVyaWFsLTMyLWJ5dGVzLWxvbmchISE"
    for raw in (f"{SECRET_KEY},{other}", f'["{SECRET_KEY}", "{other}"]'):
        settings = load_settings(env={"CONNECTOR_VAULT__KEYS": raw, "CONNECTOR_VAULT__PRIMARY_KEY_ID": "k0"})
        assert [key.get_secret_value() for key in settings.vault.keys] == [SECRET_KEY, other]
        assert settings.vault.primary_key_id == "k0"


def test_malformed_vault_key_is_refused_without_echoing_it(empty_cwd: Path) -> None:
    material = "c2VjcmV0LW5vLWtpZC1oZXJl"
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONNECTOR_VAULT__KEYS": f"{SECRET_KEY},{material}"})
    assert caught.value.file == "environment"
    assert caught.value.key == "vault.keys"
    assert "CONNECTOR_VAULT__KEYS" in caught.value.problem
    assert "entry 1" in caught.value.problem
    assert material not in str(caught.value)
    assert SECRET_KEY.split(":")[1] not in str(caught.value)


def test_secrets_are_absent_from_repr_and_str(empty_cwd: Path) -> None:
    settings = load_settings(env={"CONNECTOR_VAULT__KEYS": SECRET_KEY})
    material = SECRET_KEY.split(":")[1]
    for text in (repr(settings), str(settings), repr(settings.vault), str(settings.vault)):
        assert material not in text
    assert settings.vault.keys[0].get_secret_value() == SECRET_KEY


def test_settings_are_immutable(empty_cwd: Path) -> None:
    settings = load_settings(env={})
    with pytest.raises(ValidationError):
        settings.agent_name = "changed"  # type: ignore[misc]


# --- relative paths ---------------------------------------------------------------------------------------


def test_relative_paths_in_file_resolve_against_its_directory(tmp_path: Path) -> None:
    path = write(
        tmp_path / "etc" / "connector.toml",
        '[vault]\nkey_file = "../secrets/vault.keys"\n[providers]\ncatalog = "catalog.toml"\n',
    )
    settings = load_settings(path, env={})
    assert settings.vault.key_file == tmp_path / "secrets" / "vault.keys"
    assert settings.providers.catalog == tmp_path / "etc" / "catalog.toml"


def test_default_catalog_sits_next_to_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "etc" / "connector.toml", "")
    assert load_settings(path, env={}).providers.catalog == tmp_path / "etc" / "providers.toml"


def test_absolute_paths_and_env_paths_are_kept(tmp_path: Path) -> None:
    absolute = tmp_path / "abs" / "vault.keys"
    path = write(tmp_path / "etc" / "connector.toml", f'[vault]\nkey_file = "{absolute}"\n')
    settings = load_settings(path, env={"CONNECTOR_PROVIDERS__CATALOG": "conf/providers.toml"})
    assert settings.vault.key_file == absolute
    assert settings.providers.catalog == Path("conf/providers.toml")  # the environment's is relative to the cwd


def test_empty_key_file_means_unset(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[vault]\nkey_file = ""\nprimary_key_id = ""\n')
    settings = load_settings(path, env={})
    assert settings.vault.key_file is None
    assert settings.vault.primary_key_id is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[identity]\nverifier = "kerberos"\n', "identity.verifier"),
        ('[identity.local]\nsubject = ""\n', "identity.local.subject"),
        ('[identity.local]\nsubjet = "typo"\n', "identity.local.subjet"),
    ],
)
def test_invalid_verifier_settings_are_refused_when_the_connector_is_built(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path / "c.toml", text)
    env = {
        "CONNECTOR_VAULT__KEYS": generate_key("k1"),
        "CONNECTOR_PROVIDERS__CATALOG": str(REPO / "config/providers.toml"),
    }
    settings = load_settings(path, env=env)
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(settings)
    assert caught.value.key == key
    assert caught.value.file == str(path.resolve())
