"""Whether the installed protocol SDK is one a face was written for (each face names its range and its error)."""

from __future__ import annotations

import importlib.metadata
import re

Version = tuple[int, int, int]


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def in_range(version: str, supported: tuple[Version, Version]) -> bool:
    """`version` (its leading X.Y.Z) in [lowest, first unsupported)."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return False
    major, minor, patch = (int(part) for part in match.groups())
    return supported[0] <= (major, minor, patch) < supported[1]
