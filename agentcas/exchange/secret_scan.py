"""Secret scan of what leaves a store: rollout records (and, for `scan`, files).

Commit refuses files that look like credentials (workspace/secrets.py), but an agent's
rollout can hold what it printed: an API key echoed by a tool call. So history is
scanned with the same rules when it leaves the store: `export` scans every rollout
segment the bundle carries, `push` every segment the remote lacks. Each segment's
records are scanned together (up to 1 MiB of text per pass, the rules' Aho-Corasick
prefilter clears clean text at GB/s); a finding names the thread, the record's seq and
the rule, never the secret. `--allow-rollout-secrets` lets them pass, except a
private-key block in a bundle: a private key never leaves in a bundle (as for files).
`agentcas scan REV` reports every finding in a checkpoint's files and history.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from agentcas.cas import framing
from agentcas.cas.digest import Digest
from agentcas.cas.objects import HistoryPosition
from agentcas.errors import AgentcasError, IntegrityError
from agentcas.lineage.rollout import History
from agentcas.workspace import secrets
from agentcas.workspace.restore import file_chunks, list_files, verified_chunks

PRIVATE_KEY = next(rule for rule in secrets.RULES if rule.name == "private key block")


class RolloutSecret(AgentcasError):
    """A rollout record about to leave the store looks like it holds a credential (exit 1,
    as a commit refused for a secret: the store is sound, the user decides)."""


@dataclass(frozen=True)
class RecordFinding:
    """A likely secret in rollout record `seq` of `thread` (the secret itself is not kept)."""

    thread: str
    seq: int
    rule: str

    def to_json(self) -> dict:
        return {"thread": self.thread, "seq": self.seq, "rule": self.rule}


def findings_in(data, private_key_only: bool = False) -> Iterator[tuple[int, str]]:
    """(0-based line, rule name) of each line of `data` holding a likely secret, in order."""
    rules = (PRIVATE_KEY,) if private_key_only else secrets.RULES
    for found in secrets.scan_all(data, rules=rules):
        yield found.line - 1, found.rule


def segment_findings(txn, segment_ids: Iterable[Digest], thread: str, private_key_only: bool = False,
                     first_only: bool = False) -> list[RecordFinding]:
    """Findings in every record of the given rollout segments (each segment whole)."""
    history = History(txn)
    out = []
    for digest in segment_ids:
        segment = history.segment(digest)
        data = history.segment_bytes(segment, segment.end(digest))
        for line, rule in findings_in(data, private_key_only):
            out.append(RecordFinding(thread, segment.base.seq + line, rule))
            if first_only:
                return out
    return out


def history_findings(txn, position: HistoryPosition, thread: str) -> list[RecordFinding]:
    """Findings in records 0 <= seq < position.seq of the history at `position`."""
    out, seq = [], 0
    for piece in History(txn).read(position):
        for line, rule in findings_in(piece):
            out.append(RecordFinding(thread, seq + line, rule))
        seq += bytes(piece).count(b"\n")
    return out


def refuse_rollout_secrets(txn, segment_ids: Iterable[Digest], thread: str, verb: str, outcome: str,
                           allowed: bool, private_keys_always: bool) -> None:
    """RolloutSecret naming thread, seq and rule for the first finding (unless `allowed`)."""
    if allowed and not private_keys_always:
        return
    found = segment_findings(txn, segment_ids, thread, private_key_only=allowed, first_only=True)
    if found:
        first = found[0]
        hint = "" if allowed else " (use --allow-rollout-secrets if it is not one)"
        raise RolloutSecret(f"refusing to {verb}: rollout record seq {first.seq} of thread {thread!r} looks "
                            f"like a {first.rule}{hint}; {outcome}")


def is_binary_file(txn, entry, path: str) -> bool:
    """Whether a stored file is binary by git's rule (a NUL in its first bytes): not scanned."""
    first_id, _ = file_chunks(txn, entry)[0]
    value = txn.raw(first_id)
    if value is None:
        raise IntegrityError(f"chunk {first_id.hex()} of {path} is missing from the store")
    return secrets.is_binary(framing.unframe(value)[1][: secrets.BINARY_SNIFF])


def file_findings(txn, tree_id: Digest, allow_secrets=()) -> list[secrets.Finding]:
    """Findings in every text file of a tree (files matching `allow_secrets` globs skipped)."""
    out = []
    for path, entry in list_files(txn, tree_id):
        if entry.type != "file" or entry.size == 0:
            continue
        if any(fnmatch.fnmatchcase(path, glob) for glob in allow_secrets):
            continue
        if is_binary_file(txn, entry, path):
            continue
        seen: set = set()

        def check(data, lines_before, path=path, seen=seen):
            for line, rule in findings_in(data):
                seen.add((lines_before + line + 1, rule))

        windows = secrets.WindowScan(check)
        for data in verified_chunks(txn, entry, path):
            windows.feed(data)
        windows.finish()
        out += [secrets.Finding(path, line, rule) for line, rule in sorted(seen)]
    return out
