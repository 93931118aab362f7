"""The Store reads the web view makes, in one place, each returning the CLI's JSON document.

The view only reads. Every call goes through `StoreReads`, which asks the Store's groups
(`store.threads`, `store.checkpoints`, `store.effects`, `store.trust`) and turns each typed
result into its JSON document (`to_json()`), the form the CLI prints with --json and the
templates and /api/ documents use.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentcas.repository import Store

EFFECT_COUNTS_CACHED = 8192


def as_doc(value):
    """A typed Store result as its JSON document (a list of them as a list of documents)."""
    if isinstance(value, list):
        return [as_doc(v) for v in value]
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


@dataclass(frozen=True)
class StoreReads:
    store: Store
    # Effect counts by checkpoint id: a checkpoint's history prefix never changes, so neither
    # do the effects recorded in it (the server's process keeps the latest ones asked for).
    _effect_counts: OrderedDict = field(default_factory=OrderedDict, repr=False)

    # threads
    def threads(self) -> list[dict]:
        return as_doc(self.store.threads.list())

    def thread(self, name: str):
        """The thread's ThreadState (NotFound if there is none, UsageError for a bad name)."""
        return self.store.threads.get(name)

    def thread_names(self) -> set[str]:
        return self.store.threads.names()

    def log(self, rev: str, limit: int) -> list[dict]:
        return as_doc(self.store.threads.log(rev, limit))

    def lineage(self, root: str | None) -> dict:
        return as_doc(self.store.threads.lineage(root))

    # checkpoints
    def show(self, rev: str, files: bool) -> dict:
        return as_doc(self.store.checkpoints.show(rev, files))

    def diff(self, rev1: str, rev2: str) -> dict:
        return as_doc(self.store.checkpoints.diff(rev1, rev2))

    # effects
    def effects(self, rev: str, states=None, limit: int | None = None, before: int | None = None) -> dict:
        return as_doc(self.store.effects.list(rev, states=states, limit=limit, before=before))

    def effect_counts(self, digest: str) -> dict[str, int]:
        """{state: count} of the effects in checkpoint `digest`'s history (latest states there)."""
        counts = self._effect_counts.get(digest)
        if counts is None:
            totals = self.effects(digest, limit=1)["totals"]
            counts = dict(sorted(totals["by_state"].items())) if totals else {}
            self._effect_counts[digest] = counts
            while len(self._effect_counts) > EFFECT_COUNTS_CACHED:
                self._effect_counts.popitem(last=False)
        return counts

    def effects_after(self, rev: str) -> dict | None:
        result = self.store.effects.after_checkpoint(rev)
        return None if result is None else as_doc(result)

    # signatures
    def signature(self, digest: str) -> str:
        """valid, untrusted, invalid or absent: the checkpoint's best stored signature."""
        from agentcas.errors import IntegrityError
        from agentcas.exchange.bundle import SignatureRejected
        try:
            return self.store.trust.verify(digest).signature
        except SignatureRejected as exc:
            return exc.status
        except IntegrityError:
            return "invalid"
