"""Text that can be stored and shown as it is."""

from __future__ import annotations

import re

# Unicode's "Cc" (C0, DEL, C1) and "Cs" (surrogates) categories, exactly: one regex scan instead of a
# `unicodedata.category` call per character (every path and query of every request is checked).
CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(value: str) -> bool:
    """No control character (C0, DEL, C1 and other Unicode "Cc"/"Cs" characters: NUL, CR, LF, lone surrogates)."""
    return CONTROL_CHARACTER.search(value) is None
