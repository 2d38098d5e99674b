"""Attribute docstrings (a string right after a class attribute), read from the source when asked.

The settings' descriptions are their fields' docstrings. pydantic's `use_attribute_docstrings` reads them the same
way but at class creation, on every start: tokenizing the source of each model cost more than half of importing
the configuration, for text only `docs/reference.md` shows.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.cache
def attribute_docstrings(cls: type) -> dict[str, str]:
    """{attribute name: its docstring, cleaned} over `cls` and its bases (a subclass's wins)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue  # built-in or defined without source (e.g. at run time)
        (node,) = ast.parse(source).body
        if not isinstance(node, ast.ClassDef):
            continue
        for statement, following in zip(node.body, node.body[1:], strict=False):
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                if isinstance(following.value.value, str):
                    found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found
