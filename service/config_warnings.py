"""Configuration warnings: what the configuration sets that nothing reads, each with the nearest valid name, and a
public_base_url that does not lead to a loopback listener.

Three kinds of unread setting: CONNECTOR_* variables that are no setting (nor a provider's or a verifier's),
providers described by the environment alone (a misspelt table name?), and `[identity.<name>]` tables of no
verifier or with keys the verifier does not have (for the chosen verifier those are errors, raised when it is
built). `CONNECTOR_TEST_*` is left to test suites.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .config import (
    CONFIG_ENV_VAR,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    Settings,
    nearest,
    setting_env_var,
    setting_paths,
    unknown_key_problem,
)
from .core.errors import ConnectorError
from .identity import VerifierPlugin
from .identity import registry as verifiers
from .providers import (
    PROVIDER_ENV_SUFFIXES,
    ProviderCatalog,
    load_catalog,
    provider_env_var,
    provider_setting_env_vars,
)

__all__ = ["TEST_ENV_PREFIX", "configuration_warnings", "report_configuration_warnings"]

TEST_ENV_PREFIX = "CONNECTOR_TEST_"  # reserved for test suites' own variables (e.g. CONNECTOR_TEST_POSTGRES_URL)
PROVIDER_ENV_PREFIX = "CONNECTOR_PROVIDER_"

Warning = tuple[str, str]  # (key, sentence)


def configuration_warnings(settings: Settings, catalog: ProviderCatalog | None = None) -> list[Warning]:
    """(key, sentence) for each thing in the configuration that nothing reads. Without `catalog`, reads it if it
    can (else provider variables are not checked)."""
    if catalog is None:
        try:
            catalog = load_catalog(settings.providers.catalog, env=settings.environment())
        except ConnectorError:
            catalog = None
    plugins = verifiers.plugins()
    disagreement = settings.public_url_disagreement()
    return [
        *([("public_base_url", disagreement)] if disagreement else []),
        *_environment_only_providers(catalog),
        *_unread_variables(settings, _known_variables(plugins, catalog), catalog),
        *_unread_identity_tables(settings, plugins),
    ]


def report_configuration_warnings(settings: Settings, catalog: ProviderCatalog | None = None) -> None:
    """Log `configuration_warnings` (once per settings)."""
    for key, message in configuration_warnings(settings, catalog):
        settings.warn(key, message)


def _known_variables(plugins: Mapping[str, VerifierPlugin], catalog: ProviderCatalog | None) -> set[str]:
    """Every CONNECTOR_* variable something reads: settings and sections, verifiers' keys, providers' keys."""
    known = {CONFIG_ENV_VAR}
    for path in setting_paths():
        known.update(setting_env_var(path[:depth]) for depth in range(1, len(path) + 1))
    for name, plugin in plugins.items():
        known.add(setting_env_var(("identity", name)))
        known.update(setting_env_var(("identity", name, field)) for field in plugin.settings_model.model_fields)
    for entry in catalog.entries() if catalog is not None else ():
        known.update(provider_env_var(entry.name, suffix) for suffix in PROVIDER_ENV_SUFFIXES)
        known.update(provider_setting_env_vars(entry.name))
    return known


def _environment_only_providers(catalog: ProviderCatalog | None) -> Iterator[Warning]:
    """A provider only CONNECTOR_PROVIDERS__<NAME>__* describes may be a misspelling of one in the catalog."""
    if catalog is None:
        return
    in_file = [entry.name for entry in catalog.entries() if not entry.environment_only]
    for entry in catalog.entries():
        if entry.environment_only:
            close = nearest(entry.name, in_file)
            hint = f": a misspelling of '{close}'?" if close else ""
            yield (
                f"providers.{entry.name}",
                f"provider '{entry.name}' is described only by CONNECTOR_PROVIDERS__"
                f"{entry.name.upper()}__* variables (no [{entry.name}] table in {catalog.source}){hint}",
            )


def _unread_variables(settings: Settings, known: set[str], catalog: ProviderCatalog | None) -> Iterator[Warning]:
    """CONNECTOR_* variables nothing reads (identity tables are checked by table, in `_unread_identity_tables`)."""
    identity_prefix = setting_env_var(("identity",)) + ENV_NESTED_DELIMITER
    # Compared without the common prefix, which would make every name look alike.
    candidates = [name.removeprefix(ENV_PREFIX) for name in known]
    for variable in sorted(settings.environment()):
        name = variable.upper()
        if name in known or name.startswith((TEST_ENV_PREFIX, identity_prefix)):
            continue
        if catalog is None and name.startswith(PROVIDER_ENV_PREFIX):
            continue  # without a catalog, provider names cannot be checked
        close = nearest(name.removeprefix(ENV_PREFIX), candidates)
        hint = f": did you mean {ENV_PREFIX}{close}?" if close else " (see docs/reference.md)"
        yield variable, f"environment variable {variable} is not a setting and is ignored{hint}"


def _unread_identity_tables(settings: Settings, plugins: Mapping[str, VerifierPlugin]) -> Iterator[Warning]:
    """`[identity.<name>]` tables of no verifier, and unknown keys in those of a verifier that is not chosen."""
    for name, table in (settings.identity.model_extra or {}).items():
        if not isinstance(table, dict):
            continue
        plugin = plugins.get(name)
        if plugin is None:
            close = nearest(name, plugins)
            hint = f": did you mean [identity.{close}]?" if close else f" (verifiers: {', '.join(sorted(plugins))})"
            origin = settings.origin(("identity", name))
            yield f"identity.{name}", f"{origin}: identity.{name}: no verifier has this name, ignored{hint}"
        elif name != settings.identity.verifier:
            fields = plugin.settings_model.model_fields
            for key in (key for key in table if key not in fields):
                origin = settings.origin(("identity", name, key))
                yield f"identity.{name}.{key}", f"{origin}: identity.{name}.{key}: {unknown_key_problem(key, fields)}"
