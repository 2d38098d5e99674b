"""Tenants and the grants they may see: a grant belongs to the tenant through which it was made (an API key's
tenant, or the embedded connector's own, `EMBEDDED_TENANT`), and is visible, usable and revocable only through that
tenant, unless the operator names tenants that share (`[tenants] shared_groups`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# The embedded connector's own tenant (its grants, its grant events). An API key may not be made for it: sharing
# with the embedded connector is the operator's explicit choice (`shared_groups`), never a key's name.
EMBEDDED_TENANT = "embedded"
TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def tenant_of_key(connection_key: str) -> str:
    """The tenant a connection key belongs to: a `/v1` key names it (`v1:<tenant>:<connection>`); any other
    connection is the embedded connector's."""
    if connection_key.startswith("v1:"):
        return connection_key[3:].partition(":")[0]
    return EMBEDDED_TENANT


@dataclass(frozen=True, slots=True)
class TenantSharing:
    """Which tenants see each other's grants: each group's members share every grant among them; a tenant in no
    group sees its own alone (the default)."""

    groups: tuple[frozenset[str], ...] = ()

    @classmethod
    def of(cls, groups: Iterable[Iterable[str]]) -> TenantSharing:
        """From groups of tenant names. Raises ValueError for a name that is not a tenant's or a group of one."""
        built: list[frozenset[str]] = []
        for group in groups:
            members = frozenset(group)
            for name in members:
                if not TENANT_PATTERN.fullmatch(name):
                    raise ValueError(f"'{name}' is not a tenant name")
            if len(members) < 2:
                raise ValueError("a sharing group names at least two tenants")
            built.append(members)
        return cls(tuple(built))

    def visible(self, tenant: str) -> frozenset[str]:
        """The tenants whose grants `tenant` sees, uses and revokes: itself and those it shares a group with."""
        found = {tenant}
        for group in self.groups:
            if tenant in group:
                found |= group
        return frozenset(found)

    def sees(self, tenant: str, owner: str) -> bool:
        """Whether `tenant` may see a grant (or a grant event) of `owner`."""
        return owner in self.visible(tenant)
