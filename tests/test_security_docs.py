"""SECURITY.md names the test that proves each defence: every test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_security_md_names_exists() -> None:
    text = (ROOT / "SECURITY.md").read_text()
    named: list[tuple[str, str | None]] = []
    current = None
    for path, name in re.findall(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", text):
        current = path or current
        if path or name:
            assert current is not None, f"::{name} follows no file"
            named.append((current, name or None))
    assert len(named) > 40
    missing = []
    for path, name in named:
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
            continue
        if name is not None:
            functions = {
                n.name
                for n in ast.walk(ast.parse(file.read_text()))
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if name not in functions:
                missing.append(f"{path}::{name}")
    assert missing == []
