"""Helpers of the gc tests: stores with files and records, every key, what threads reach."""

from __future__ import annotations

import os
import time

from agentcas import Store
from agentcas.lineage.closure import Walker
from agentcas.refs import threads

from support import raw_objects
from support.store_state import views

LATER = 5  # seconds: plan "now" this far ahead, so objects just written are past a 0s grace


def later() -> float:
    return time.time() + LATER


def write_files(root, files: dict) -> str:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    return str(root)


def all_keys(store: Store) -> set[bytes]:
    with views(store) as txn:
        return raw_objects.keys(txn)


def closure_of_threads(store: Store) -> set[bytes]:
    """Every object reachable from thread refs and reflog states, by an independent full walk."""
    seen: set = set()
    with views(store) as txn:
        walker = Walker(txn, seen, verify=True)
        for _, state in threads.list_threads(txn):
            if state.checkpoint:
                list(walker.checkpoint(state.checkpoint))
            if state.history.segment:
                list(walker.history(state.history))
        for _, entry in threads.all_reflog_entries(txn):
            if entry.new.checkpoint:
                list(walker.checkpoint(entry.new.checkpoint))
            if entry.new.history.segment:
                list(walker.history(entry.new.history))
            if entry.old:
                list(walker.checkpoint(entry.old))
    return seen


def records(n: int, tag: str, width: int = 300) -> bytes:
    return b"".join(b'{"i": %d, "t": "%s", "pad": "%s"}\n' % (i, tag.encode(), os.urandom(width // 2).hex().encode())
                    for i in range(n))
