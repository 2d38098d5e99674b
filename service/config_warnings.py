"""Configuration warnings: what the configuration sets that nothing reads, each with the nearest valid name, and a
public_base_url that does not lead to a loopback listener.

Three kinds of unread setting: CONNECTOR_* variables that are no setting (nor a provider's or a verifier's),
providers described by the environment alone (a misspelt table name?), and `[identity.<name>]` tables of no
verifier or with keys the verifier does not have (for the chosen verifier those are errors, raised when it is
built). `CONNECTOR_TEST_*` is left to test suites.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

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
from .providers import (
    PROVIDER_ENV_SUFFIXES,
    ProviderCatalog,
    load_catalog,
    provider_env_var,
    provider_setting_env_vars,
)

if TYPE_CHECKING:
    from .identity import VerifierPlugin

__all__ = ["TEST_ENV_PREFIX", "configuration_warnings", "report_configuration_warnings"]

TEST_ENV_PREFIX = "CONNECTOR_TEST_"  # reserved for test suites' own variables (e.g. CONNECTOR_TEST_POSTGRES_URL)
PROVIDER_ENV_PREFIX = "CONNECTOR_PROVIDER_"

Warning = tuple[str, str]  # (key, sentence)


def configuration_warnings(settings: Settings, catalog: ProviderCatalog | None = None) -> list[Warning]:
    """(key, sentence) for each thing in the configuration that nothing reads. Without `catalog`, reads it if it
    can (else provider variables are not checked).

    The catalog and the verifier plugins are read only when a variable or an `[identity.<name>]` table needs them:
    a command whose CONNECTOR_* variables are all settings imports no verifier and parses no catalog."""
    loose = _loose_variables(settings)
    identity_tables = {
        name: table for name, table in (settings.identity.model_extra or {}).items() if isinstance(table, dict)
    }
    if loose and catalog is None:
        try:
            catalog = load_catalog(settings.providers.catalog, env=settings.environment())
        except ConnectorError:
            catalog = None
    plugins = _verifier_plugins() if loose or identity_tables else {}
    disagreement = settings.public_url_disagreement()
    return [
        *([("public_base_url", disagreement)] if disagreement else []),
        *(_environment_only_providers(catalog) if loose else ()),
        *_unread_variables(loose, _known_variables(plugins, catalog) if loose else set(), catalog),
        *_unread_identity_tables(settings, identity_tables, plugins),
    ]


def report_configuration_warnings(settings: Settings, catalog: ProviderCatalog | None = None) -> None:
    """Log `configuration_warnings` (once per settings)."""
    for key, message in configuration_warnings(settings, catalog):
        settings.warn(key, message)


def _verifier_plugins() -> dict[str, VerifierPlugin]:
    from .identity import registry  # every built-in verifier, and the installed ones: only when needed

    return registry.plugins()


def _setting_variables() -> set[str]:
    """The CONNECTOR_* variables of the settings and their sections (verifiers and providers have their own)."""
    known = {CONFIG_ENV_VAR}
    for path in setting_paths():
        known.update(setting_env_var(path[:depth]) for depth in range(1, len(path) + 1))
    return known


def _loose_variables(settings: Settings) -> list[str]:
    """The CONNECTOR_* variables that are no setting, sorted: a provider's or a verifier's variable, or a typo.
    Verifiers' variables are checked by table (`_unread_identity_tables`), test suites' are left to them."""
    identity_prefix = setting_env_var(("identity",)) + ENV_NESTED_DELIMITER
    settings_variables = _setting_variables()
    return sorted(
        variable
        for variable in settings.environment()
        if variable.upper() not in settings_variables
        and not variable.upper().startswith((TEST_ENV_PREFIX, identity_prefix))
    )


def _known_variables(plugins: Mapping[str, VerifierPlugin], catalog: ProviderCatalog | None) -> set[str]:
    """Every CONNECTOR_* variable something reads: settings and sections, verifiers' keys, providers' keys."""
    known = _setting_variables()
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


def _unread_variables(loose: list[str], known: set[str], catalog: ProviderCatalog | None) -> Iterator[Warning]:
    """The loose CONNECTOR_* variables nothing reads."""
    # Compared without the common prefix, which would make every name look alike.
    candidates = [name.removeprefix(ENV_PREFIX) for name in known]
    for variable in loose:
        name = variable.upper()
        if name in known:
            continue
        if catalog is None and name.startswith(PROVIDER_ENV_PREFIX):
            continue  # without a catalog, provider names cannot be checked
        close = nearest(name.removeprefix(ENV_PREFIX), candidates)
        hint = f": did you mean {ENV_PREFIX}{close}?" if close else " (see docs/reference.md)"
        yield variable, f"environment variable {variable} is not a setting and is ignored{hint}"


def _unread_identity_tables(
    settings: Settings, tables: Mapping[str, Mapping[str, object]], plugins: Mapping[str, VerifierPlugin]
) -> Iterator[Warning]:
    """`[identity.<name>]` tables of no verifier, and unknown keys in those of a verifier that is not chosen."""
    for name, table in tables.items():
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
