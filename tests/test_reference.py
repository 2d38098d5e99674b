"""docs/reference.md is generated from the code: it must say exactly what the code says, and the code must give it
something to say (a description for every setting and verifier setting, a meaning for every audit event)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.config import field_description, setting_description, setting_paths
from service.core.audit_events import AUDIT_EVENTS
from service.identity import registry as verifiers
from service.reference import render

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


def test_the_reference_file_is_what_the_code_generates() -> None:
    assert REFERENCE.read_text() == render(), "docs/reference.md is out of date: run `make reference`"


def test_the_reference_does_not_depend_on_what_was_imported_first() -> None:
    # typing keeps one object for equal Literals: mcp spells our four token endpoint methods in another order, and
    # a process that imported it first (as the suite's workers may) rendered them in its order.
    script = "import mcp.shared.auth\nfrom service.reference import render\nprint(render(), end='')"
    rendered = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert rendered.stdout == REFERENCE.read_text()


@pytest.mark.parametrize("path", setting_paths(), ids=".".join)
def test_every_setting_is_described(path: tuple[str, ...]) -> None:
    assert setting_description(path), f"{'.'.join(path)}: give the field a docstring (its description)"


@pytest.mark.parametrize("name", sorted(verifiers.plugins()))
def test_every_verifier_setting_is_described(name: str) -> None:
    model = verifiers.plugins()[name].settings_model
    assert [key for key in model.model_fields if not field_description(model, key)] == []


def test_every_audit_event_has_a_meaning() -> None:
    assert all(meaning.strip().endswith(".") for meaning in AUDIT_EVENTS.values())


def test_an_unregistered_audit_event_is_flagged() -> None:
    from service.core.audit_events import UnregisteredAuditEvent, checked_event

    with pytest.warns(UnregisteredAuditEvent, match="not_an_event"):
        checked_event("not_an_event")
