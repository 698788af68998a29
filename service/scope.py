"""Which indexes a caller may read: a search key's scope (docs/security.md, "Keys for some libraries").

A search key configured with index names reads those indexes only; a key without names, and every caller when
no search keys are set, reads every index (EVERY). security.py gives each request its key's scope
(deps.KeyScope); the registry applies it at every lookup (registry.get, registry.default_name) and the listing
routes show Scope.visible's indexes only, so an index outside the scope is answered exactly as one that does not
exist: 404 index_not_found with the same message, whose list of served indexes holds the scope's only. A scoped
caller cannot tell another library from no library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, TypeVar

V = TypeVar("V")


@dataclass(frozen=True)
class Scope:
    # None: every index. Else the index names in the order configured: the first one served is the key's
    # default when the server's default index is not one of them (registry.default_name)
    names: tuple[str, ...] | None = None

    def allows(self, name: str) -> bool:
        return self.names is None or name in self.names

    def visible(self, by_name: Mapping[str, V]) -> dict[str, V]:
        """The entries of a name -> value mapping (the served handles, the refused versions) this scope may see."""
        return {n: v for n, v in by_name.items() if self.allows(n)}


EVERY = Scope()
