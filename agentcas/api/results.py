"""The typed results of the `Store` API, all in one namespace (docs/API.md lists them).

Each result is a frozen dataclass whose fields are what the CLI, the MCP tools and the
adapters read; `to_json()` gives the one JSON document `agentcas --json` prints for it
(docs/API.md lists them). By default a field is the JSON key of the same name and its
value is rendered by `json_value`: ids stay 64-hex strings, a `HistoryPosition` or
`ForkOrigin` becomes its document, a nested result its own `to_json()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentcas.cas.objects import HistoryPosition
from agentcas.lineage.appends import AppendResult
from agentcas.lineage.checkpoints import CommitResult
from agentcas.lineage.effects_index import EffectState
from agentcas.lineage.effects_ledger import EffectAdded, EffectsPage, OpenEffects
from agentcas.lineage.fork_tree import Lineage, LineageNode
from agentcas.lineage.marks import IngestedThread
from agentcas.refs.threads import ForkOrigin, ReflogEntry
from agentcas.result import Result, json_value


# -- checkpoints ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileInfo(Result):
    """A file of a checkpoint's tree."""

    path: str
    size: int
    mode: int
    id: str


@dataclass(frozen=True)
class CheckpointInfo(Result):
    """`show REV`: a checkpoint's fields (and with `files`, its files)."""

    OMIT_NONE = frozenset({"files"})

    checkpoint: str
    tree: str
    parents: list[str]
    thread: str
    reason: str
    author: str
    created_at: str
    runtime: dict
    history: HistoryPosition
    format: int
    files: list[FileInfo] | None = None


@dataclass(frozen=True)
class LogEntry(Result):
    """One checkpoint of `log`, newest first along first parents."""

    checkpoint: str
    reason: str
    thread: str
    created_at: str
    author: str
    parents: list[str]
    history: HistoryPosition


@dataclass(frozen=True)
class FileSize(Result):
    """A file added or removed between two checkpoints."""

    path: str
    size: int


@dataclass(frozen=True)
class FileResize(Result):
    """A file whose content or mode changed between two checkpoints."""

    path: str
    old_size: int
    new_size: int


@dataclass(frozen=True)
class RecordsDiff(Result):
    """How two histories compare: the common prefix, then records only in one or the other.

    A history only grows, so no record is changed in place (`changed` is always 0): past
    the common prefix, `from`'s records count as removed and `to`'s as added.
    """

    from_seq: int
    to_seq: int
    common: int
    added: int
    added_range: list[int]
    removed: int
    changed: int = 0


@dataclass(frozen=True)
class DiffResult(Result):
    """`diff REV1 REV2`: files added, removed and changed, and the records compared."""

    JSON_NAMES = {"from_": "from"}

    from_: str
    to: str
    added: list[FileSize]
    removed: list[FileSize]
    changed: list[FileResize]
    records: RecordsDiff


@dataclass(frozen=True)
class CheckoutResult(Result):
    """A checkpoint restored into a new directory, and the effects that did not undo."""

    checkpoint: str
    tree: str
    dest: str
    files: int
    effects: OpenEffects | None
    rollout_file: str | None = None  # where the rollout file committed with it was written back


@dataclass(frozen=True)
class ScanReport(Result):
    """Likely secrets in a revision's files and history (the secrets themselves not shown)."""

    checkpoint: str | None
    thread: str
    records: int
    clean: bool
    files: list[dict]
    history: list[dict]


# -- threads -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ThreadInfo(Result):
    """A thread as `branch` lists it."""

    thread: str
    checkpoint: str | None
    history: HistoryPosition
    forked_from: ForkOrigin | None


@dataclass(frozen=True)
class ReflogItem(Result):
    """A reflog entry and its name as a revision (THREAD@{N})."""

    rev: str
    entry: ReflogEntry

    def to_json(self) -> dict:
        return dict(self.entry.to_json(), rev=self.rev)


@dataclass(frozen=True)
class BranchResult(Result):
    """A thread made at a checkpoint."""

    thread: str
    checkpoint: str


@dataclass(frozen=True)
class DeleteResult(Result):
    """A thread deleted (its reflog with it)."""

    thread: str
    deleted: bool
    checkpoint: str | None


@dataclass(frozen=True)
class ForkResult(Result):
    """A thread forked from a prefix of another's history."""

    thread: str
    source: str
    seq: int
    checkpoint: str | None
    history: HistoryPosition


@dataclass(frozen=True)
class RevertResult(Result):
    """A thread moved to a checkpoint; its old head stays in the reflog."""

    thread: str
    checkpoint: str
    previous: str | None
    history: HistoryPosition
    related: bool
    notes: list[str]
    effects: OpenEffects | None


# -- histories, effects, the fork tree: defined in their layer (lineage/), imported above ---------

# -- gc and fsck ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GcResult(Result):
    """What a gc sweep did."""

    deleted_objects: int
    deleted_bytes: int
    reflog_expired: int
    pins_dropped: int
    remarked: int
    batches: int
    complete: bool
    blocked_by: list[dict]
    repack: dict | None = None  # an embedded store: {"packs_rewritten", "objects_moved", "bytes_reclaimed"}
    # a shared store: {"deleted": packs left with nothing live, "unnamed": packs no index row
    # named (a writer or sweep killed midway), "unnamed_bytes"}, or {"skipped": "writers"}
    packs: dict | None = None

    @classmethod
    def from_doc(cls, doc: dict) -> GcResult:
        """From the document gc/sweep.py's `execute` returns."""
        return cls(doc["deleted"]["objects"], doc["deleted"]["bytes"], doc["reflog_expired"], doc["pins_dropped"],
                   doc["remarked"], doc["batches"], doc["complete"], doc["blocked_by"], doc.get("repack"),
                   doc.get("packs"))

    def to_json(self) -> dict:
        doc = {"deleted": {"objects": self.deleted_objects, "bytes": self.deleted_bytes},
               "reflog_expired": self.reflog_expired, "pins_dropped": self.pins_dropped,
               "remarked": self.remarked, "batches": self.batches, "complete": self.complete,
               "blocked_by": list(self.blocked_by)}
        if self.repack is not None:
            doc["repack"] = dict(self.repack)
        if self.packs is not None:
            doc["packs"] = dict(self.packs)
        return doc


@dataclass(frozen=True)
class GcReport(Result):
    """A gc: its plan (as JSON), what the sweep did (None for a dry run), the lineage report if asked."""

    OMIT_NONE = frozenset({"report"})

    dry_run: bool
    plan: dict
    result: GcResult | None
    report: dict | None = None


@dataclass(frozen=True)
class GcExplanation(Result):
    """Why an object is alive (the path from a root to it), or that it is unreachable."""

    doc: dict

    def to_json(self) -> dict:
        return self.doc


@dataclass(frozen=True)
class FsckReport(Result):
    """The result of verifying every object, row, position and closure."""

    OMIT_NONE = frozenset({"packs"})

    ok: bool
    objects: int
    rows: int
    roots: int
    problems: list[dict]
    packs: dict | None = None  # an embedded store: {"count", "bytes", "reclaimable_bytes"}


# -- signing, bundles, remotes ----------------------------------------------------------------------
@dataclass(frozen=True)
class TrustRemoved(Result):
    """A signer no longer trusted."""

    entry: Any  # signing.trust.TrustEntry

    def to_json(self) -> dict:
        return dict(self.entry.to_doc(), removed=True)


@dataclass(frozen=True)
class SignResult(Result):
    """A signature stored over a checkpoint."""

    checkpoint: str
    thread: str
    signature: str
    key_id: str
    signed_at: str
    namespace: str


@dataclass(frozen=True)
class VerifyResult(Result):
    """A checkpoint's stored signatures judged: a trusted one verified."""

    checkpoint: str
    thread: str
    signature: str
    reason: str
    verified: bool
    signatures: list[dict]


@dataclass(frozen=True)
class BundleExport(Result):
    """A bundle written."""

    bundle: str
    checkpoint: str
    thread: str
    bytes: int
    objects: int
    checkpoints: int
    files: int
    history_records: int
    signatures: list[str]


@dataclass(frozen=True)
class BundleDocument(Result):
    """A bundle verified (and imported): the document of `verify BUNDLE` / `import BUNDLE`.

    The fields every such document has are typed; the whole document is `doc`.
    """

    doc: dict

    @property
    def checkpoint(self) -> str:
        return self.doc["checkpoint"]

    @property
    def thread(self) -> str:
        return self.doc["thread"]

    @property
    def reason(self) -> str:
        return self.doc["reason"]

    @property
    def objects(self) -> int:
        return self.doc["objects"]

    @property
    def files(self) -> int:
        return self.doc["files"]

    def to_json(self) -> dict:
        return self.doc


@dataclass(frozen=True)
class BundleCheck(BundleDocument):
    """`verify BUNDLE`: every hash, the closure, the length and the signatures checked."""


@dataclass(frozen=True)
class BundleImport(BundleDocument):
    """`import BUNDLE`: verified, then landed as a new thread or a fast-forward."""

    @property
    def imported_as(self) -> str:
        return self.doc["imported_as"]

    @property
    def moved(self) -> bool:
        return self.doc["moved"]

    @property
    def new_objects(self) -> int:
        return self.doc["new_objects"]

    @property
    def new_bytes(self) -> int:
        return self.doc["new_bytes"]


@dataclass(frozen=True)
class RemoteAdded(Result):
    """A remote recorded; `created` when an empty store was made for it at a new or empty path."""

    remote: Any  # exchange.remote.Remote
    created: bool = False

    @property
    def name(self) -> str:
        return self.remote.name

    @property
    def url(self) -> str:
        return self.remote.url

    def to_json(self) -> dict:
        return dict(self.remote.to_doc(), created=self.created)


@dataclass(frozen=True)
class RemoteRemoved(Result):
    """A remote forgotten (the remote store itself untouched)."""

    remote: Any  # exchange.remote.Remote

    def to_json(self) -> dict:
        return dict(self.remote.to_doc(), removed=True)


@dataclass(frozen=True)
class TransferResult(Result):
    """A push or pull: the thread before and after, and the objects sent or received."""

    direction: str  # "push" or "pull"
    remote: str
    url: str
    thread: str
    old_checkpoint: str | None
    new_checkpoint: str | None
    old_seq: int | None
    new_seq: int
    objects_total: int
    up_to_date: bool
    forced: bool
    objects: int
    bytes: int

    def to_json(self) -> dict:
        moved = "sent" if self.direction == "push" else "received"
        return {"remote": self.remote, "url": self.url, "thread": self.thread,
                "old_checkpoint": self.old_checkpoint, "new_checkpoint": self.new_checkpoint,
                "old_seq": self.old_seq, "new_seq": self.new_seq, "objects_total": self.objects_total,
                "up_to_date": self.up_to_date, "forced": self.forced,
                f"objects_{moved}": self.objects, f"bytes_{moved}": self.bytes}


__all__ = [
    "AppendResult", "BranchResult", "BundleCheck", "BundleExport", "BundleImport", "CheckoutResult",
    "CheckpointInfo", "CommitResult", "DeleteResult", "DiffResult", "EffectAdded", "EffectState", "EffectsPage",
    "FileInfo", "FileResize", "FileSize", "ForkResult", "FsckReport", "GcExplanation", "GcReport", "IngestedThread",
    "GcResult", "Lineage", "LineageNode", "LogEntry", "OpenEffects", "RecordsDiff", "ReflogItem",
    "RemoteRemoved", "Result", "RevertResult", "ScanReport", "SignResult", "ThreadInfo",
    "TransferResult", "TrustRemoved", "VerifyResult", "json_value",
]
