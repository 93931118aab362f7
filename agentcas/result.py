"""`Result`: the base of the typed results the API returns (agentcas/api/results.py lists them).

A result is a frozen dataclass whose fields callers read; `to_json()` gives the JSON
document the CLI prints for it with --json. By default each field is the JSON key of the
same name and its value is rendered by `json_value`: ids are kept as 64-hex strings, a
domain object (`HistoryPosition`, `ForkOrigin`) becomes its `to_doc()`, a nested result
its own `to_json()`. This module imports nothing of agentcas, so every layer may use it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar


def json_value(value: Any) -> Any:
    """`value` as JSON: results by their `to_json`, domain objects by their `to_doc`."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    to_json = getattr(value, "to_json", None)
    if to_json is not None:
        return to_json()
    to_doc = getattr(value, "to_doc", None)
    if to_doc is not None:
        return to_doc()
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {key: json_value(item) for key, item in value.items()}
    raise TypeError(f"no JSON form for {type(value).__name__}")


class Result:
    """Base of the result types: `to_json()` from the fields (see the module doc).

    `JSON_NAMES` renames a field in the JSON (`from_` -> `from`); `OMIT_NONE` names fields
    left out of the JSON while None (asked-for parts, as `show --files`).
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {}
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict:
        doc = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.name in self.OMIT_NONE:
                continue
            doc[self.JSON_NAMES.get(f.name, f.name)] = json_value(value)
        return doc
