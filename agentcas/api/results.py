"""The typed results of the `Store` API, all in one namespace (docs/API.md lists them).

Each result is a frozen dataclass whose fields are what the CLI, the MCP tools and the
adapters read; `to_json()` gives the one JSON document `agentcas --json` prints for it
(docs/API.md lists them). By default a field is the JSON key of the same name and its
value is rendered by `json_value`: ids stay 64-hex strings, a `HistoryPosition` or
`ForkOrigin` becomes its document, a nested result its own `to_json()`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from agentcas.cas.objects import HistoryPosition
from agentcas.lineage.appends import AppendResult
from agentcas.lineage.checkpoints import CommitResult
from agentcas.lineage.effects_index import EffectState
from agentcas.lineage.effects_ledger import EffectAdded, EffectsPage, OpenEffects
from agentcas.lineage.fork_tree import Lineage, LineageNode
from agentcas.lineage.marks import IngestedThread
from agentcas.refs.threads import ForkOrigin, ReflogEntry
from agentcas.result import Result, json_value

if TYPE_CHECKING:
    from agentcas.cas.digest import Digest
    from agentcas.cas.objects import Checkpoint
    from agentcas.exchange.remote import Remote
    from agentcas.exchange.secret_scan import RecordFinding
    from agentcas.signing.envelope import Verdict
    from agentcas.signing.trust import TrustEntry


# -- checkpoints ---------------------------------------------------------------------------------
class ResolvedCheckpoint(NamedTuple):
    """A checkpoint a revision names: its id and the verified Checkpoint (`id, cp = ...` unpacks it)."""

    id: Digest
    checkpoint: Checkpoint


class SigningTarget(NamedTuple):
    """What a signature over a revision binds: the checkpoint's id and the thread (the thread
    named, else the checkpoint's own)."""

    checkpoint: Digest
    thread: str


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
class SecretInFile(Result):
    """A likely secret in a checkpoint's file: the file, the line, the rule (never the secret)."""

    path: str
    line: int
    rule: str


@dataclass(frozen=True)
class ScanReport(Result):
    """Likely secrets in a revision's files and history (the secrets themselves not shown)."""

    checkpoint: str | None
    thread: str
    records: int
    clean: bool
    files: list[SecretInFile]
    history: list[RecordFinding]


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
class Tally(Result):
    """A count of objects and their stored bytes."""

    objects: int
    bytes: int

    @classmethod
    def from_doc(cls, doc: dict) -> Tally:
        return cls(doc["objects"], doc["bytes"])


@dataclass(frozen=True)
class HeldByGrace(Result):
    """Unreachable objects kept because they were written less than the grace ago; when any
    are, how many seconds until the first and the last of them may go."""

    OMIT_NONE = frozenset({"releases_from_seconds", "releases_by_seconds"})

    objects: int
    bytes: int
    oldest_written_at: int | None
    newest_written_at: int | None
    releases_from_seconds: int | None = None
    releases_by_seconds: int | None = None

    @classmethod
    def from_doc(cls, doc: dict) -> HeldByGrace:
        return cls(doc["objects"], doc["bytes"], doc["oldest_written_at"], doc["newest_written_at"],
                   doc.get("releases_from_seconds"), doc.get("releases_by_seconds"))


@dataclass(frozen=True)
class Reclaimable(Result):
    """What a sweep would delete, in all and by object kind."""

    objects: int
    bytes: int
    by_kind: dict[str, Tally]

    @classmethod
    def from_doc(cls, doc: dict) -> Reclaimable:
        return cls(doc["objects"], doc["bytes"], {k: Tally.from_doc(v) for k, v in doc["by_kind"].items()})


@dataclass(frozen=True)
class ReflogExpiry(Result):
    """The reflog entries kept so far and how many of them this gc expires."""

    entries: int
    expiring: int


@dataclass(frozen=True)
class WriteInProgress(Result):
    """A write's lease as gc read it: a write in progress (while `live`) that gc waits for."""

    what: str
    host: str
    pid: int
    started_at: int
    expires_at: int
    live: bool

    @classmethod
    def from_doc(cls, doc: dict) -> WriteInProgress:
        return cls(doc["what"], doc["host"], doc["pid"], doc["started_at"], doc["expires_at"], doc["live"])


@dataclass(frozen=True)
class GcPlanSummary(Result):
    """A gc plan as reported (`gc --dry-run`): roots, reflog, objects live, held and reclaimable.

    The plan itself (gc.plan.GcPlan) also holds its marks and candidates; this is what it
    found, read from its `to_json()`."""

    store: str
    now: int
    grace_seconds: int
    expire_reflog_seconds: int
    roots: dict[str, int]              # root kind -> how many
    reflog: ReflogExpiry
    pins: list[WriteInProgress]
    objects: int
    live: Tally
    held_by_grace: HeldByGrace
    reclaimable: Reclaimable
    notes: list[str]

    @classmethod
    def from_doc(cls, doc: dict) -> GcPlanSummary:
        """From the document a GcPlan's `to_json` returns."""
        return cls(doc["store"], doc["now"], doc["grace_seconds"], doc["expire_reflog_seconds"], dict(doc["roots"]),
                   ReflogExpiry(doc["reflog"]["entries"], doc["reflog"]["expiring"]),
                   [WriteInProgress.from_doc(p) for p in doc["pins"]], doc["objects"], Tally.from_doc(doc["live"]),
                   HeldByGrace.from_doc(doc["held_by_grace"]), Reclaimable.from_doc(doc["reclaimable"]),
                   list(doc["notes"]))


@dataclass(frozen=True)
class RepackSummary(Result):
    """An embedded store's repack after a sweep: packs rewritten, objects moved, bytes reclaimed."""

    packs_rewritten: int
    bytes_reclaimed: int
    objects_moved: int


@dataclass(frozen=True)
class PackSweep(Result):
    """A shared store's packs after a sweep: `deleted`, packs left with nothing live; then
    `unnamed` (and `unnamed_bytes`), packs no index row named (a writer or sweep killed
    midway), or `skipped` ("writers": a writer held a lease; "incomplete": the sweep was)."""

    OMIT_NONE = frozenset({"unnamed", "unnamed_bytes", "skipped"})

    deleted: int
    unnamed: int | None = None
    unnamed_bytes: int | None = None
    skipped: str | None = None

    @classmethod
    def from_doc(cls, doc: dict) -> PackSweep:
        return cls(doc["deleted"], doc.get("unnamed"), doc.get("unnamed_bytes"), doc.get("skipped"))


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
    blocked_by: list[WriteInProgress]
    repack: RepackSummary | None = None  # an embedded store
    packs: PackSweep | None = None       # a shared store

    @classmethod
    def from_doc(cls, doc: dict) -> GcResult:
        """From the document gc/sweep.py's `execute` returns."""
        repack, packs = doc.get("repack"), doc.get("packs")
        return cls(doc["deleted"]["objects"], doc["deleted"]["bytes"], doc["reflog_expired"], doc["pins_dropped"],
                   doc["remarked"], doc["batches"], doc["complete"],
                   [WriteInProgress.from_doc(p) for p in doc["blocked_by"]],
                   None if repack is None else RepackSummary(**repack),
                   None if packs is None else PackSweep.from_doc(packs))

    def to_json(self) -> dict:
        doc = {"deleted": {"objects": self.deleted_objects, "bytes": self.deleted_bytes},
               "reflog_expired": self.reflog_expired, "pins_dropped": self.pins_dropped,
               "remarked": self.remarked, "batches": self.batches, "complete": self.complete,
               "blocked_by": json_value(self.blocked_by)}
        if self.repack is not None:
            doc["repack"] = self.repack.to_json()
        if self.packs is not None:
            doc["packs"] = self.packs.to_json()
        return doc


@dataclass(frozen=True)
class GcReport(Result):
    """A gc: its plan, what the sweep did (None for a dry run), and with `report` asked for,
    the lineage report (gc/report.py), or once that was written to a file, the file's path
    (`report_written_to`: `gc --report FILE`)."""

    OMIT_NONE = frozenset({"report", "report_file"})

    dry_run: bool
    plan: GcPlanSummary
    result: GcResult | None
    report: dict | None = None
    report_file: str | None = None

    def report_written_to(self, path: str) -> GcReport:
        """This gc, its lineage report written to the file `path`: named, no longer held."""
        return replace(self, report=None, report_file=path)


@dataclass(frozen=True)
class GcExplanation(Result):
    """Why an object is alive (the path from a root to it), or that it is unreachable."""

    doc: dict

    def to_json(self) -> dict:
        return self.doc


@dataclass(frozen=True)
class FsckProblem(Result):
    """One thing fsck found wrong: `what` (row, corrupt, missing, position, closure, pack, ...),
    a message, and where, as far as known (the rest left out of the JSON): the object `id`,
    its `kind` and the object that names it (`referenced_by`), the `table` and `key` of a
    row, the `pack`, the `root` that reaches it."""

    OMIT_NONE = frozenset({"id", "kind", "referenced_by", "table", "key", "pack", "root"})

    what: str
    message: str
    id: str | None = None
    kind: str | None = None
    referenced_by: str | None = None
    table: str | None = None
    key: str | None = None
    pack: str | None = None
    root: str | None = None

    @classmethod
    def from_doc(cls, doc: dict) -> FsckProblem:
        return cls(**doc)


@dataclass(frozen=True)
class PackUsage(Result):
    """A store's packs: how many, their bytes, and the bytes a repack would reclaim."""

    count: int
    bytes: int
    reclaimable_bytes: int


@dataclass(frozen=True)
class FsckReport(Result):
    """The result of verifying every object, row, position and closure."""

    OMIT_NONE = frozenset({"packs"})

    ok: bool
    objects: int
    rows: int
    roots: int
    problems: list[FsckProblem]
    packs: PackUsage | None = None  # a store of packs (embedded, or shared on S3)

    @classmethod
    def from_doc(cls, doc: dict) -> FsckReport:
        """From the document gc/fsck.py's `fsck` returns."""
        packs = doc.get("packs")
        return cls(doc["ok"], doc["objects"], doc["rows"], doc["roots"],
                   [FsckProblem.from_doc(p) for p in doc["problems"]], None if packs is None else PackUsage(**packs))


# -- signing, bundles, remotes ----------------------------------------------------------------------
@dataclass(frozen=True)
class TrustRemoved(Result):
    """A signer no longer trusted."""

    entry: TrustEntry

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
    signatures: list[Verdict]  # every stored signature's verdict


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

    remote: Remote
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

    remote: Remote

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
