"""Deterministic test data for the benchmarks (seeded; the same bytes on every run).

- `random_tree`: N files of incompressible bytes (BLAKE3 in XOF mode, keyed by a seed and
  the file number: fast, and no two files share a chunk).
- `text_tree`: N files of text and JSON (config-like JSON documents, log lines, prose-like
  Markdown), compressible roughly like source trees (zstd ~3-4x), with no file-level
  duplicates.
- `Rollout`: an agent rollout as JSONL: user and assistant messages, tool calls with
  arguments, tool results (code listings, command output), turn boundaries; varied text,
  sizes from ~100 B to a few KiB per record. `Rollout.take(n_bytes)` continues the same
  conversation, so "append 1 MB" appends new records, never a repeat.
- `message`: the ~300-byte chat message the LangGraph workload appends per step.
"""

from __future__ import annotations

import json
import os
import random

import blake3

_SYLLABLES = ["ka", "lo", "mi", "ren", "sto", "var", "qu", "ex", "pin", "dal", "tor", "ne", "fi",
              "ash", "gru", "be", "col", "da", "im", "port", "self", "def", "run", "ret", "ob",
              "ject", "str", "ing", "con", "fig", "ser", "ver", "cli", "ent", "da", "ta"]
_PUNCT = [".", ".", ".", ",", ",", "?", ":", ";"]


def _vocabulary(rng: random.Random, size: int = 6000) -> list[str]:
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))))
    common = ["the", "a", "to", "of", "and", "in", "is", "that", "for", "it", "file", "test",
              "error", "function", "value", "return", "we", "this", "with", "not"]
    return sorted(words) + common * 40  # a Zipf-ish skew toward common words


class _Text:
    """Random words, sentences, identifiers and code lines.

    With `pooled=True` sentences and code lines are drawn from pools generated once
    (distinct, ~100k each): ~10x faster, for the 100-200 MB rollouts; the records built
    from them still differ (ids, numbers, order, lengths).
    """

    def __init__(self, seed: int, pooled: bool = False):
        self.rng = random.Random(seed)
        self.words = _vocabulary(self.rng)
        self._sentences = self._code_lines = None
        if pooled:
            self._sentences = [self.sentence() for _ in range(100000)]
            self._code_lines = [self._code_line(i % 4) for i in range(100000)]

    def pooled_sentence(self) -> str:
        if self._sentences is None:
            return self.sentence()
        return self.rng.choice(self._sentences)

    def sentence(self, lo=4, hi=18) -> str:
        words = self.rng.choices(self.words, k=self.rng.randint(lo, hi))
        words[0] = words[0].capitalize()
        return " ".join(words) + self.rng.choice(_PUNCT)

    def prose(self, lo=1, hi=6) -> str:
        return " ".join(self.pooled_sentence() for _ in range(self.rng.randint(lo, hi)))

    def ident(self) -> str:
        return "_".join(self.rng.choices(self.words[:6000], k=self.rng.randint(1, 3)))

    def hexid(self, n=24) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"

    def _code_line(self, kind: int) -> str:
        indent = "    " * self.rng.randint(0, 3)
        if kind == 0:
            args = ", ".join(self.ident() for _ in range(self.rng.randint(0, 3)))
            return f"{indent}def {self.ident()}({args}):"
        if kind == 1:
            return f"{indent}return {self.ident()}"
        if kind == 2:
            return f"{indent}# {self.sentence(3, 10)}"
        return f"{indent}{self.ident()} = {self.ident()}({self.rng.randint(0, 9999)}, \"{self.ident()}\")"

    def code(self, lines: int) -> str:
        if self._code_lines is not None:
            return "\n".join(self.rng.choices(self._code_lines, k=lines))
        return "\n".join(self._code_line(self.rng.randrange(4)) for _ in range(lines))


# --- directory trees ---------------------------------------------------------------------------

def _layout(root: str, files: int) -> list[str]:
    """files spread over 10 directories x 10 subdirectories."""
    paths = []
    for i in range(files):
        d = os.path.join(root, f"dir{i % 10:02d}", f"sub{(i // 10) % 10:02d}")
        os.makedirs(d, exist_ok=True)
        paths.append(os.path.join(d, f"file{i:05d}"))
    return paths


def random_tree(root: str, total_bytes: int, files: int, seed: int = 1) -> list[str]:
    """`files` files of incompressible bytes summing to `total_bytes`; their paths."""
    size = total_bytes // files
    paths = _layout(root, files)
    key = blake3.blake3(f"agentcas-bench-random-{seed}".encode()).digest()
    for i, path in enumerate(paths):
        data = blake3.blake3(i.to_bytes(8, "big"), key=key).digest(length=size)
        with open(path + ".bin", "wb") as handle:
            handle.write(data)
    return [p + ".bin" for p in paths]


def text_tree(root: str, total_bytes: int, files: int, seed: int = 2) -> list[str]:
    """`files` text/JSON/Markdown/code files summing to about `total_bytes`; their paths.

    A pool of distinct lines is generated once and each file draws its own random
    sequence of lines from it (plus fresh ids and numbers), so files compress like
    text but no two files, and practically no two chunks, are equal.
    """
    text = _Text(seed)
    rng = text.rng
    pool = []
    for i in range(60000):
        kind = i % 4
        if kind == 0:
            pool.append(json.dumps({"id": text.hexid(), "name": text.ident(), "count": rng.randint(0, 10**6),
                                    "tags": rng.choices(text.words, k=3), "note": text.sentence()}))
        elif kind == 1:
            pool.append(f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
                        f" INFO {text.ident()}: {text.sentence()}")
        elif kind == 2:
            pool.append(text.prose(1, 3))
        else:
            pool.append(text.code(1))
    size = total_bytes // files
    paths = _layout(root, files)
    out = []
    for i, path in enumerate(paths):
        ext = (".json", ".log", ".md", ".py")[i % 4]
        parts, length = [], 0
        while length < size:
            lines = rng.choices(pool, k=256)
            lines.append(f"# {i} {length} {text.hexid(16)}")
            block = "\n".join(lines) + "\n"
            parts.append(block)
            length += len(block)
        with open(path + ext, "w") as handle:
            handle.write("".join(parts)[:size])
        out.append(path + ext)
    return out


# --- rollouts ------------------------------------------------------------------------------

TOOLS = ["bash", "read_file", "write_file", "search", "apply_patch", "list_dir", "run_tests"]


class Rollout:
    """An endless, deterministic agent conversation as JSONL lines (bytes)."""

    def __init__(self, seed: int = 3):
        self.text = _Text(seed, pooled=True)
        self.rng = self.text.rng
        self.seq = 0
        self.turn = 0
        self.clock = 1_795_000_000_000

    def _record(self) -> dict:
        rng, text = self.rng, self.text
        self.clock += rng.randint(50, 20000)
        phase = self.seq % 6
        base = {"ts": self.clock, "id": f"rec_{text.hexid(20)}"}
        if phase == 0:
            self.turn += 1
            return {**base, "type": "message", "role": "user", "content": text.prose(1, 4)}
        if phase == 1:
            return {**base, "type": "message", "role": "assistant", "content": text.prose(1, 5),
                    "model": "model-x-2026", "usage": {"input_tokens": rng.randint(500, 90000),
                                                       "output_tokens": rng.randint(10, 2000)}}
        if phase == 2:
            tool = rng.choice(TOOLS)
            args = {"path": f"src/{text.ident()}/{text.ident()}.py"} if tool != "bash" else \
                {"command": f"{text.ident()} --{text.ident()} {rng.randint(1, 99)}"}
            return {**base, "type": "tool_call", "call_id": f"call_{text.hexid(12)}", "name": tool,
                    "arguments": args}
        if phase == 3:
            return {**base, "type": "tool_result", "call_id": f"call_{text.hexid(12)}",
                    "exit_code": rng.choice([0, 0, 0, 1]), "output": text.code(rng.randint(2, 60))}
        if phase == 4:
            return {**base, "type": "message", "role": "assistant", "content": text.prose(1, 3)}
        return {**base, "type": "turn_end", "turn": self.turn, "duration_ms": rng.randint(200, 90000),
                "tokens": rng.randint(100, 100000)}

    def line(self) -> bytes:
        record = self._record()
        record["seq"] = self.seq
        self.seq += 1
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    def take(self, n_bytes: int) -> bytes:
        """Whole records totalling at least n_bytes."""
        parts, size = [], 0
        while size < n_bytes:
            line = self.line()
            parts.append(line)
            size += len(line)
        return b"".join(parts)

    def write(self, path: str, n_bytes: int, mode: str = "ab", block: int = 8 << 20) -> int:
        """Append whole records totalling at least n_bytes to `path`; bytes written."""
        written = 0
        with open(path, mode) as handle:
            while written < n_bytes:
                data = self.take(min(block, n_bytes - written))
                handle.write(data)
                written += len(data)
        return written


def message(text: _Text, step: int) -> dict:
    """One chat message of about 300 bytes as JSON (role, content, id, step)."""
    role = "user" if step % 2 == 0 else "assistant"
    content = text.sentence(30, 42)
    while len(content) < 215:
        content += " " + text.sentence(3, 6)
    return {"role": role, "content": content[:230], "id": f"msg_{text.hexid(20)}", "step": step}


def messages(count: int, seed: int = 4) -> list[dict]:
    text = _Text(seed)
    return [message(text, i) for i in range(count)]
