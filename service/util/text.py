"""Text that can be stored and shown as it is."""

from __future__ import annotations

import re

# Unicode's "Cc" (C0, DEL, C1) and "Cs" (surrogates) categories, exactly: one regex scan instead of a
# `unicodedata.category` call per character (every path and query of every request is checked).
CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(value: str) -> bool:
    """No control character (C0, DEL, C1 and other Unicode "Cc"/"Cs" characters: NUL, CR, LF, lone surrogates)."""
    return CONTROL_CHARACTER.search(value) is None


# What a database does not give back as it was given: PostgreSQL refuses a NUL in text and SQLite's JSON functions
# end a text there; an unpaired surrogate cannot be encoded as UTF-8 at all.
NOT_STORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: str) -> bool:
    """Text both databases store and give back as it is: no NUL, no unpaired surrogate."""
    return NOT_STORABLE.search(value) is None
