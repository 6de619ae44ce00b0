"""One copy of each value that many cached views repeat.

Decoded from JSON, every pod of a Job carries its own copy of the same label keys, the Job's
name and uid, the namespace, the owner's apiVersion and the tolerations the API server added;
a view holding those copies costs twice what it needs to (docs/benchmarks.md, "Memory per
pod"). The parsers pass such values through :class:`Shared` and keep the first equal copy.

The table is bounded: when it holds ``limit`` entries it is emptied and sharing starts over, so
the values of objects long gone are not kept for ever (views keep what they hold). Not
``sys.intern``: interned strings are immortal on some CPython versions, and label values are
written by whoever creates pods.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

__all__ = ["DEFAULT_LIMIT", "Shared"]

DEFAULT_LIMIT = 1 << 16
T = TypeVar("T", bound=Hashable)
_VALUE = object()  # tags the keys of :meth:`Shared.value`


class Shared:
    """A bounded table of canonical strings and flat mappings.

    Shared mappings are plain dicts, like every mapping in a view: nothing may mutate them.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._table: dict[Hashable, Any] = {}

    def __len__(self) -> int:
        return len(self._table)

    def _keep(self, key: Hashable, value: Any) -> Any:
        if len(self._table) >= self.limit:
            self._table.clear()
        self._table[key] = value
        return value

    def text(self, value: str) -> str:
        """The shared copy of ``value``."""
        found: str | None = self._table.get(value)
        return found if found is not None else self._keep(value, value)

    def value(self, value: T) -> T:
        """The shared copy of an immutable, hashable value (a tuple of gates, of frozen owner
        references): every pod of a Job holds the same ones."""
        key = (_VALUE, value)  # tagged: an empty tuple is also the key of an empty mapping
        found: T | None = self._table.get(key)
        return found if found is not None else self._keep(key, value)

    def mapping(self, value: Mapping[str, Any]) -> dict[str, Any]:
        """The shared copy of a flat mapping (a toleration, say); one with nested values is
        copied, not shared. Equal mappings in another key order are kept apart (the API server
        serves one order)."""
        items = tuple(value.items())
        try:
            found: dict[str, Any] | None = self._table.get(items)
        except TypeError:  # a nested value is not hashable
            return dict(items)
        return found if found is not None else self._keep(items, dict(items))
