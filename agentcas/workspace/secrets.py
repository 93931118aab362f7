"""Secret scan: refuse to store files that look like they hold credentials.

Each rule has literal anchors and a regex. Clean text (the common case) is cleared
by one leftmost-first Aho-Corasick pass (the Rust `aho-corasick` crate via
ahocorasick-rs, which releases the GIL): with leftmost semantics the crate uses its
SIMD "Teddy" prefilter, ~2 GB/s per core here, and it reports a match whenever any
anchor occurs. Only then does an overlapping pass (~0.6 GB/s; a leftmost pass could
hide one anchor inside another, such as `_SECRET` inside `AWS_SECRET`) name every
anchor found, and only the rules whose anchors occur run their regex.
Files whose first 8,000 bytes hold a NUL are treated as binary and not scanned,
as git does for diffs. Findings name file, line and rule; the secret itself is
never echoed.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import ahocorasick_rs

BINARY_SNIFF = 8000
# Large files are scanned in windows (see WindowScan), never held whole.
SCAN_WINDOW = 16 * 1024 * 1024
SCAN_OVERLAP = 64 * 1024  # a secret shorter than this that straddles two windows is seen whole


class Rule:
    """A named kind of credential: literal anchors that any match contains, and a regex
    (compiled the first time an anchor occurs: clean text and short reasons never pay
    for compiling the rules)."""

    __slots__ = ("name", "anchors", "source", "min_entropy", "_pattern")

    def __init__(self, name: str, anchors: tuple[bytes, ...], source: bytes, min_entropy: float = 0.0):
        self.name = name
        self.anchors = anchors
        self.source = source
        self.min_entropy = min_entropy  # bits per character of the captured value, if any
        self._pattern: re.Pattern | None = None

    @property
    def pattern(self) -> re.Pattern:
        if self._pattern is None:
            self._pattern = re.compile(self.source)
        return self._pattern

    def compiled(self) -> bool:
        return self._pattern is not None


RULES = (
    Rule("private key block", (b"PRIVATE KEY",),
         rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    Rule("AWS access key id", (b"AKIA", b"ASIA", b"ABIA", b"ACCA"),
         rb"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    Rule("AWS secret access key", (b"aws_secret", b"AWS_SECRET"),
         rb"(?i)aws_secret_access_key\s*[=:]\s*[\"']?([A-Za-z0-9/+=]{40})"),
    Rule("GitHub token", (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"),
         rb"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})"),
    Rule("Anthropic API key", (b"sk-ant-",),
         rb"\bsk-ant-[a-z]{2,10}\d{2}-[A-Za-z0-9_\-]{32,}"),
    Rule("OpenAI API key", (b"sk-",),
         rb"\bsk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{32,}", 3.5),
    Rule("Slack token", (b"xox", b"xapp-", b"hooks.slack.com"),
         (rb"\bxox[abposr]-[0-9A-Za-z\-]{10,}|\bxapp-\d-[A-Z0-9]+-\d+-[0-9a-f]{32,}"
          rb"|https://hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]+")),
    Rule("Google API key", (b"AIza", b"GOCSPX-"),
         rb"\bAIza[0-9A-Za-z_\-]{35}|\bGOCSPX-[A-Za-z0-9_\-]{28}"),
    Rule("JSON Web Token", (b"eyJ",),
         rb"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"),
    Rule("secret assignment", (b"_TOKEN", b"_SECRET", b"_token", b"_secret", b"_Token", b"_Secret"),
         # The value: 16+ characters without quotes or separators, unless it is a call such
         # as `get_token(request)`: code, not a credential.
         (rb"(?i)\b[A-Za-z0-9_]*_(?:TOKEN|SECRET)[\"']?\s*[=:]\s*[\"']?"
          rb"(?![A-Za-z_][A-Za-z0-9_.]*\([^\s]*\)(?:[\s;,]|\Z))([^\s\"',;]{16,})"), 3.0),
)


class Finding(tuple):
    """A likely secret: the file (or what was scanned), its line and the rule's name; never the secret."""

    __slots__ = ()

    def __new__(cls, path: str, line: int, rule: str):
        return tuple.__new__(cls, (path, line, rule))

    path = property(lambda self: self[0])
    line = property(lambda self: self[1])
    rule = property(lambda self: self[2])

    def __repr__(self) -> str:
        return f"Finding(path={self.path!r}, line={self.line}, rule={self.rule!r})"


def _entropy(value: bytes) -> float:
    counts = Counter(value)
    return -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())


def is_binary(head) -> bool:
    # bytes() first: `in` on a memoryview compares single items, not a subsequence.
    return b"\0" in bytes(head[:BINARY_SNIFF])


_ANCHORS = [(index, anchor) for index, rule in enumerate(RULES) for anchor in rule.anchors]
_ANY_ANCHOR = ahocorasick_rs.BytesAhoCorasick([anchor for _, anchor in _ANCHORS],
                                              matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
_EVERY_ANCHOR = ahocorasick_rs.BytesAhoCorasick([anchor for _, anchor in _ANCHORS])


def scan(data, path: str, sniff: bool = True) -> Finding | None:
    """The first likely secret in `data` (any bytes-like object), or None.

    `sniff=False`: the caller has already decided the file is text (a window of a large
    file is scanned even if a NUL appears near its start).
    """
    if (sniff and is_binary(data)) or not _ANY_ANCHOR.find_matches_as_indexes(data):
        return None
    hit_rules = {_ANCHORS[found][0] for found, _, _ in _EVERY_ANCHOR.find_matches_as_indexes(data, overlapping=True)}
    for index, rule in enumerate(RULES):
        if index not in hit_rules:
            continue
        for match in rule.pattern.finditer(data):
            value = match.group(match.lastindex or 0)
            if rule.min_entropy and _entropy(value) < rule.min_entropy:
                continue
            return Finding(path, bytes(data[: match.start()]).count(b"\n") + 1, rule.name)
    return None


def scan_all(data, path: str = "", rules=RULES) -> list[Finding]:
    """Every line of `data` (text) holding a likely secret, once each (the first of `rules`
    that matches it), in line order; a finding never carries the secret."""
    if not _ANY_ANCHOR.find_matches_as_indexes(data):
        return []
    hit_rules = {_ANCHORS[found][0] for found, _, _ in _EVERY_ANCHOR.find_matches_as_indexes(data, overlapping=True)}
    by_line: dict[int, str] = {}
    for index, rule in enumerate(RULES):
        if index not in hit_rules or rule not in rules:
            continue
        for match in rule.pattern.finditer(data):
            value = match.group(match.lastindex or 0)
            if rule.min_entropy and _entropy(value) < rule.min_entropy:
                continue
            line = bytes(data[: match.start()]).count(b"\n") + 1
            by_line.setdefault(line, rule.name)
    return [Finding(path, line, by_line[line]) for line in sorted(by_line)]


# A commit's reason is allowed to hold a likely secret by `--allow-secret` with a glob
# matching this name (no file can be named so: it is not a relative path a tree holds).
REASON = ":reason"


def scan_text(text: str, what: str) -> Finding | None:
    """The first likely secret in a short text that is not a file: a reason, a file name."""
    return scan(text.encode("utf-8", "surrogatepass"), what, sniff=False)


class WindowScan:
    """Secret-scan a file fed in pieces, a window of about SCAN_WINDOW bytes at a time,
    and release each piece only once every byte of it has been scanned.

    Each window starts SCAN_OVERLAP bytes before the previous one ended, so a secret
    shorter than that which straddles two windows is seen whole in the second; pieces
    that reach into those carried bytes are held back until the next window has been
    scanned, so no part of such a secret is released before it is seen. Line numbers
    count from the start of the file. `check(data, newlines before data)` raises on a
    secret; `check=None` (a binary file) scans nothing but batches the same way.
    """

    def __init__(self, check):
        self.check = check
        self.pieces: list = []  # not yet released, in file order; they start at `start`
        self.start = 0
        self.fresh: list = []   # pieces fed since the last window
        self.fresh_size = 0
        self.carry = b""        # the previous window's last SCAN_OVERLAP bytes; they start at `carry_at`
        self.carry_at = 0
        self.lines_before = 0   # newlines in the file before `carry_at`

    def feed(self, piece) -> list:
        self.pieces.append(piece)
        self.fresh.append(piece)
        self.fresh_size += len(piece)
        return self._window(final=False) if self.fresh_size >= SCAN_WINDOW else []

    def finish(self) -> list:
        return self._window(final=True)

    def _window(self, final: bool) -> list:
        data = b"".join([self.carry, *self.fresh])
        self.fresh, self.fresh_size = [], 0
        if self.check is not None:
            self.check(data, self.lines_before)
        if final:
            released, self.pieces = self.pieces, []
            return released
        keep = min(SCAN_OVERLAP, len(data))
        self.lines_before += data.count(b"\n", 0, len(data) - keep)
        self.carry_at += len(data) - keep
        self.carry = data[len(data) - keep:]
        released = []
        while self.pieces and self.start + len(self.pieces[0]) <= self.carry_at:
            piece = self.pieces.pop(0)
            self.start += len(piece)
            released.append(piece)
        return released
