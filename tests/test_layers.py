"""The house rules of `service/`, read from the source: arrows point down, no circles, each SDK in its one place.

The tables below are the rules; `docs/architecture.md` shows them in its generated block ("Rules of the house"),
which `test_architecture_doc_shows_these_tables` keeps equal (`make reference` rewrites it). A module may import its
own layer or lower ones, never a higher one; inside one layer only the listed edges are allowed. Imports under
`if TYPE_CHECKING:` are annotations only and are not counted.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parent.parent / "service"

LAYERS: list[set[str]] = [
    {"service.util"},
    {"service.core"},
    {"service.config", "service.logs", "service.metrics", "service.vault", "service.providers", "service.version"},
    {
        "service.oauth",
        "service.store",
        "service.events",
        "service.faces",
        "service.acp",
        "service.mcp",
        "service.identity",
        "service.tokens",
        "service.rotation",
        "service.rate_limiter",
    },
    {"service.web", "service.factories", "service.config_warnings", "service.console"},
    {"service.app"},
    {"service.connector", "service.client", "service.bootstrap"},
    {"service.cli", "service.reference", "service.testing", "service"},
]
# Allowed imports between siblings of one layer (any other sideways import is refused).
ADAPTER_EDGES = {
    ("service.providers", "service.config"),  # the catalog names where a value came from as the settings do
    ("service.identity", "service.oauth"),
    ("service.identity", "service.store"),
    ("service.tokens", "service.oauth"),
    ("service.tokens", "service.store"),
    ("service.tokens", "service.events"),
    ("service.rotation", "service.store"),
    ("service.events", "service.store"),
    ("service.acp", "service.faces"),  # the protocol faces share the Lifecycle port, never each other
    ("service.mcp", "service.faces"),
    ("service.cli", "service.testing"),  # `acp-connector mock-provider` serves the test kit's mock provider
    ("service.reference", "service.cli"),  # docs/reference.md lists the commands
    ("service.web", "service.console"),  # the console's pages over its operations (the CLI shares them)
}
# Third-party packages and the only parts of service/ that may import them.
CONFINED = {
    "acp": {"service.acp", "service.testing"},
    "mcp": {"service.mcp"},  # the official MCP SDK: only the MCP face
    "mcp_types": {"service.mcp"},
    "sqlalchemy": {"service.store"},
    "alembic": {"service.store"},
    "authlib": {"service.oauth"},
    "starlette": {"service.web", "service.identity", "service.testing", "service.app", "service.connector"},
    "uvicorn": {"service.web", "service.testing"},
    "h11": {"service.web"},  # uvicorn's HTTP/1.1 protocol: its refusal of a second answer (web/front.py)
    "prometheus_client": {"service.metrics"},
    "structlog": {"service.logs"},
    "limits": {"service.rate_limiter"},
}
CORE_FORBIDDEN = {"starlette", "acp", "mcp", "mcp_types", "httpx", "sqlalchemy", "authlib", "uvicorn", "h11", "jinja2"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SERVICE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> tuple[str, ...]:
    """Absolute names of every module `path` imports, except under `if TYPE_CHECKING:` (parsed once per file)."""
    return _imports_of(path)


@functools.cache
def _imports_of(path: Path) -> tuple[str, ...]:
    return tuple(_each_import(path))


def _each_import(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _area(module: str) -> str:
    """The layer unit a module belongs to: `service.core.x` -> `service.core`, `service` -> `service`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _layer(area: str) -> int:
    for index, members in enumerate(LAYERS):
        if area in members:
            return index
    raise AssertionError(f"{area} is in no layer: add it to tests/test_layers.py LAYERS")


MODULES = {_module_name(p): p for p in SERVICE.rglob("*.py")}
GRAPH = {name: {m for m in _imports(path) if m in MODULES} for name, path in MODULES.items()}


def test_arrows_point_down() -> None:
    wrong = []
    for module, path in MODULES.items():
        source = _area(module)
        for imported in _imports(path):
            if not imported.startswith("service") or imported not in MODULES:
                continue
            target = _area(imported)
            if target == source:
                continue
            up = _layer(target) > _layer(source)
            sideways = _layer(target) == _layer(source) and (source, target) not in ADAPTER_EDGES
            if up or sideways:
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_no_import_circles() -> None:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    # A package importing its own submodules (re-exports) is not a circle of behaviour.
    real = [c for c in cycles if not all(c[0].startswith(m) or m.startswith(c[0]) for m in c)]
    assert real == []


@pytest.mark.parametrize("package", sorted(CONFINED))
def test_third_party_packages_stay_in_their_place(package: str) -> None:
    allowed = CONFINED[package]
    found = sorted(
        module
        for module, path in MODULES.items()
        if any(i == package or i.startswith(package + ".") for i in _imports(path)) and _area(module) not in allowed
    )
    assert found == []


def test_core_imports_no_framework() -> None:
    found = sorted(
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        if _area(module) == "service.core"
        for imported in _imports(path)
        if imported.split(".")[0] in CORE_FORBIDDEN
    )
    assert found == []


def test_util_imports_the_standard_library_only() -> None:
    """`service/util/` is the bottom: generic helpers that import nothing of the connector and no third party."""
    found = sorted(
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        if _area(module) == "service.util"
        for imported in _imports(path)
        if not imported.startswith("service.util")
        and imported.split(".")[0] not in sys.stdlib_module_names
        and imported != "__future__.annotations"
    )
    assert found == []
    assert MODULES.keys() >= {"service.util.clock", "service.util.locks"}  # the test still looks where it must


SDK_PRIVATE = re.compile(r"\._(conn|handler|run_request|transport|disconnected|closed)\b")


def test_only_the_adapter_touches_sdk_internals() -> None:
    """`rg "\\._(conn|handler|run_request|transport|disconnected|closed)\\b" service/` matches only the adapter."""
    found = sorted(
        f"{path.relative_to(SERVICE.parent)}:{number}"
        for path in SERVICE.rglob("*.py")
        if path != SERVICE / "acp" / "adapter.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SDK_PRIVATE.search(line)
    )
    assert found == []
    assert SDK_PRIVATE.search((SERVICE / "acp" / "adapter.py").read_text())  # the pattern still finds what it must


def test_nothing_imports_private_sdk_modules() -> None:
    """Private `acp._*` modules (e.g. `acp._transport`) are used nowhere, the test kit included."""
    found = sorted(
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        for imported in _imports(path)
        if imported.startswith("acp._")
    )
    assert found == []


MCP_SDK_PRIVATE = re.compile(r"\._connection\b")


def test_only_the_mcp_adapter_touches_mcp_sdk_internals() -> None:
    """Inside the MCP face (the only package with the SDK), the SDK's `ServerSession._connection` is read in
    `mcp/adapter.py` only; nothing imports a private module of the SDK (`mcp._*`, `mcp.*._*`, `mcp_types._*`)."""
    adapter = SERVICE / "mcp" / "adapter.py"
    found = sorted(
        f"{path.relative_to(SERVICE.parent)}:{number}"
        for path in (SERVICE / "mcp").rglob("*.py")
        if path != adapter
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if MCP_SDK_PRIVATE.search(line) or '"_connection"' in line
    )
    assert found == []
    assert '"_connection"' in adapter.read_text()  # the adapter still names what it reads
    private = sorted(
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        for imported in _imports(path)
        if imported.split(".")[0] in ("mcp", "mcp_types") and any(p.startswith("_") for p in imported.split(".")[1:])
    )
    assert private == []


def test_the_shared_lifecycle_knows_no_protocol() -> None:
    """`service.faces` (the Lifecycle port both faces drive) imports neither protocol SDK nor either face."""
    found = sorted(
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        if _area(module) == "service.faces"
        for imported in _imports(path)
        if imported.split(".")[0] in ("acp", "mcp", "mcp_types") or _area(imported) in ("service.acp", "service.mcp")
    )
    assert found == []


ARCHITECTURE_DOC = SERVICE.parent / "docs" / "architecture.md"
BEGIN, END = "<!-- layers: generated from tests/test_layers.py -->", "<!-- /layers -->"


def _short(area: str) -> str:
    return "service/__init__" if area == "service" else area.removeprefix("service.")


def render_rules() -> str:
    """The tables above as the Markdown block of docs/architecture.md."""
    layers = "  <-  ".join(", ".join(sorted(f"`{_short(a)}`" for a in members)) for members in LAYERS)
    edges = ", ".join(f"`{_short(a)}` -> `{_short(b)}`" for a, b in sorted(ADAPTER_EDGES))
    confined = "\n".join(
        f"  - `{package}`: only {', '.join(sorted(f'`{_short(a)}`' for a in areas))}"
        for package, areas in sorted(CONFINED.items())
    )
    forbidden = ", ".join(f"`{name}`" for name in sorted(CORE_FORBIDDEN))
    return "\n".join(
        [
            BEGIN,
            f"- Arrows point down (lowest first; a module imports its own layer or lower ones): {layers}.",
            f"- Sideways imports inside a layer only along these edges: {edges}.",
            "- Third-party packages and the only parts of `service/` that import them:",
            confined,
            f"- `core` imports no framework: none of {forbidden}.",
            "- `util` imports the standard library only.",
            END,
        ]
    )


def _doc_block(text: str) -> tuple[int, int]:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return start, end


def test_architecture_doc_shows_these_tables() -> None:
    text = ARCHITECTURE_DOC.read_text()
    start, end = _doc_block(text)
    assert text[start:end] == render_rules(), "docs/architecture.md is stale: run `make reference`"


if __name__ == "__main__":  # `make reference`: rewrite the generated block of docs/architecture.md
    text = ARCHITECTURE_DOC.read_text()
    start, end = _doc_block(text)
    ARCHITECTURE_DOC.write_text(text[:start] + render_rules() + text[end:])


SIZE_LINE = 400
SIZE_SECTION = "## Files over 400 lines"


def test_files_over_the_size_line_are_named_in_the_architecture_doc() -> None:
    """No file under service/ grows past ~400 lines unnoticed: each one that does is named, with its reason, in
    docs/architecture.md (and a name there that no longer applies is taken out)."""
    doc = (SERVICE.parent / "docs" / "architecture.md").read_text()
    assert SIZE_SECTION in doc
    section = doc.split(SIZE_SECTION, 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^- `(service/[\w/]+\.py)`", section, flags=re.MULTILINE))
    over = {
        str(path.relative_to(SERVICE.parent))
        for path in SERVICE.rglob("*.py")
        if len(path.read_text().splitlines()) > SIZE_LINE
    }
    assert over <= named, f"over {SIZE_LINE} lines and not named under {SIZE_SECTION!r}: {sorted(over - named)}"
    assert named <= over, f"named under {SIZE_SECTION!r} but no longer over {SIZE_LINE} lines: {sorted(named - over)}"
