"""Telling whether a host name could mislead a person: Punycode/IDN labels and mixed scripts.

Used by the consent page (to warn) and by the scripted test client (to flag), so both judge hosts alike.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostAssessment:
    host: str  # as given
    unicode_host: str  # IDNA-decoded for display
    punycode: bool  # some label is an IDN (xn--) or non-ASCII
    mixed_script: bool  # some label mixes letters from different scripts (e.g. Latin and Cyrillic)

    @property
    def suspicious(self) -> bool:
        return self.punycode or self.mixed_script


def _script(ch: str) -> str | None:
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else "UNKNOWN"


def _decode_label(label: str) -> str:
    if label.lower().startswith("xn--"):
        try:
            return label.encode("ascii").decode("idna")
        except UnicodeError:
            return label
    return label


def assess_host(host: str) -> HostAssessment:
    labels = host.rstrip(".").split(".")
    decoded = [_decode_label(label) for label in labels]
    punycode = any(label.lower().startswith("xn--") for label in labels) or not host.isascii()
    mixed = False
    for label in decoded:
        scripts = {s for s in (_script(ch) for ch in label) if s is not None}
        if len(scripts) > 1:
            mixed = True
    return HostAssessment(host=host, unicode_host=".".join(decoded), punycode=punycode, mixed_script=mixed)
