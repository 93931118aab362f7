"""The in-memory metadata store: tables in dicts (tests, `memory://` stores).

A write runs `fn` on a copy of the tables that replaces them only when `fn` returns,
so an exception leaves nothing; one lock serialises writers (and so makes every
compare_and_set atomic). A reader gets a copy taken under the lock: a snapshot.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from agentcas.cas.metastore.base import TABLES, MetadataStore, MetaTxn


class _MemoryMetaTxn(MetaTxn):
    def __init__(self, tables: dict[str, dict[bytes, bytes]], writable: bool):
        self._tables = tables
        self._writable = writable

    def _rows(self, table: str) -> dict[bytes, bytes]:
        return self._tables[table]

    def get(self, table, key, for_update=False):
        return self._rows(table).get(bytes(key))

    def scan(self, table, prefix=b"", start=None, reverse=False):
        rows = self._rows(table)
        keys = sorted(k for k in rows if k.startswith(prefix))
        if start is not None:
            keys = [k for k in keys if (k <= start if reverse else k >= start)]
        if reverse:
            keys.reverse()
        for key in keys:
            if key in rows:  # deleted by the caller while it iterates
                yield key, rows[key]

    def _writing(self) -> None:
        if not self._writable:
            raise PermissionError("a metadata reader cannot write")

    def put(self, table, key, value):
        self._writing()
        self._rows(table)[bytes(key)] = bytes(value)

    def put_new(self, table, key, value):
        self._writing()
        rows = self._rows(table)
        if bytes(key) in rows:
            return False
        rows[bytes(key)] = bytes(value)
        return True

    def delete(self, table, key):
        self._writing()
        return self._rows(table).pop(bytes(key), None) is not None

    def compare_and_set(self, table, key, old, new):
        self._writing()
        rows = self._rows(table)
        key = bytes(key)
        if rows.get(key) != (None if old is None else bytes(old)):
            return False
        if new is None:
            rows.pop(key, None)
        else:
            rows[key] = bytes(new)
        return True

    def count(self, table):
        return len(self._rows(table))


class MemoryMetadataStore(MetadataStore):
    """Tables in dicts; a write runs on a copy that replaces the original on success."""

    def __init__(self) -> None:
        self.url = "memory://"
        self._tables: dict[str, dict[bytes, bytes]] = {name: {} for name in TABLES}
        self._lock = threading.RLock()

    def _copy(self) -> dict[str, dict[bytes, bytes]]:
        return {name: dict(rows) for name, rows in self._tables.items()}

    @contextmanager
    def reader(self):
        with self._lock:
            snapshot = self._copy()
        yield _MemoryMetaTxn(snapshot, writable=False)

    def write(self, fn):
        with self._lock:
            draft = self._copy()
            result = fn(_MemoryMetaTxn(draft, writable=True))
            self._tables = draft
            return result
