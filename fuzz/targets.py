"""Fuzz targets: every decoder agentcas runs on bytes it did not write itself.

Each target takes one input (bytes) and must either accept it or reject it with an
exception of its allowed set (docs/RELIABILITY.md, "Fuzzing"): for every decoder that is
`AgentcasError`, the family the CLI prints as one clear line with its exit code. Any
other exception (ValueError, KeyError, RecursionError, MemoryError...) reaches the
user as "internal error" and is a finding. Decoders that read files (bundles, key
files) get the input written to one scratch file on a tmpfs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from agentcas.cas import encoding, framing
from agentcas.cas.objects import Checkpoint, ChunkList, Segment, Tree
from agentcas.errors import AgentcasError
from agentcas.exchange import bundle
from agentcas.exchange.bundle_format import Manifest
from agentcas.lineage import rollout
from agentcas.signing import keys
from agentcas.signing.envelope import Envelope

ALLOWED = (AgentcasError,)
MAX_INPUT = 1 << 20

# The scratch file: in $AGENTCAS_FUZZ_SCRATCH (the runners pass a directory they remove),
# else in a temporary directory removed at exit.
_scratch_dir = os.environ.get("AGENTCAS_FUZZ_SCRATCH")
if not _scratch_dir:
    _scratch_dir = tempfile.mkdtemp(prefix="agentcas-fuzz-",
                                    dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    atexit.register(shutil.rmtree, _scratch_dir, True)
_scratch = os.path.join(_scratch_dir, f"input-{os.getpid()}")
_memory = None


def _as_file(data: bytes) -> str:
    with open(_scratch, "wb") as out:
        out.write(data)
    return _scratch


def _objects():
    global _memory
    if _memory is None:
        from agentcas import Store
        _memory = Store.memory().backends
    return _memory


def fuzz_bundle(data: bytes) -> None:
    """The whole import check (pass 1, closure, manifest against objects, signatures)."""
    with open(_as_file(data), "rb") as handle:
        bundle.check_bundle(_objects(), handle)


def fuzz_manifest(data: bytes) -> None:
    Manifest.decode(data)


def fuzz_tree(data: bytes) -> None:
    Tree.decode(data)


def fuzz_checkpoint(data: bytes) -> None:
    Checkpoint.decode(data)


def fuzz_chunklist(data: bytes) -> None:
    ChunkList.decode(data)


def fuzz_segment(data: bytes) -> None:
    Segment.decode(data)


def fuzz_encoding(data: bytes) -> None:
    """The canonical encoding every structured object, row and manifest is decoded with."""
    encoding.decode(data)


def fuzz_framing(data: bytes) -> None:
    """A stored or received value: header (kind, size, CRC), then raw or zstd body."""
    framing.read_header(data)
    framing.unframe(data)


def fuzz_envelope(data: bytes) -> None:
    Envelope.decode(data)


def fuzz_public_key(data: bytes) -> None:
    """A NAME.pub or ssh-ed25519 line (trust add)."""
    keys.parse_public_key(data)


def fuzz_private_key(data: bytes) -> None:
    """A NAME.key PEM file (sign, export --sign)."""
    keys.load_signing_key(_as_file(data))


def fuzz_rollout(data: bytes) -> None:
    """Records to append: JSONL validation, grouping into segments, chunking."""
    rollout.prepare(data, lambda digest, framed: None)


TARGETS = {name[len("fuzz_"):]: fn for name, fn in globals().items() if name.startswith("fuzz_")}


def one_input(target, data: bytes) -> None:
    """Run `target` on one input; re-raise anything outside its allowed set."""
    if len(data) > MAX_INPUT:
        return
    try:
        target(data)
    except ALLOWED:
        pass
