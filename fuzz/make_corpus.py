"""Write the seed corpus (fuzz/corpus/TARGET/*) from a real store: `python fuzz/make_corpus.py`.

One small workspace (a text file, a multi-chunk file, a subdirectory) and a rollout are
committed; the seeds are the real objects of that store (each kind's decoded bytes and
framed values), its signed bundle and manifest, a signature envelope, a key pair and
some records. Seeds are a few KiB at most (bundles are cut down by size), so the
corpus stays small in the repository.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from agentcas import Store  # noqa: E402
from agentcas.cas import framing  # noqa: E402
from agentcas.exchange.bundle_format import MAGIC, U32  # noqa: E402
from agentcas.signing import envelope, keys  # noqa: E402

KINDS = {framing.KIND_TREE: "tree", framing.KIND_CHECKPOINT: "checkpoint",
         framing.KIND_CHUNKLIST: "chunklist", framing.KIND_SEGMENT: "segment"}


def seed(target: str, data: bytes) -> None:
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, hashlib.sha1(data).hexdigest()[:16]), "wb") as out:
        out.write(data)


def main() -> None:
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)
    work = tempfile.mkdtemp()
    try:
        rng = random.Random(14)
        ws = os.path.join(work, "ws")
        os.makedirs(os.path.join(ws, "sub"))
        with open(os.path.join(ws, "notes.md"), "w") as out:
            out.write("plan: seeds\n")
        with open(os.path.join(ws, "sub", "data.bin"), "wb") as out:  # a chunk list (max chunk 512 KiB)
            out.write(rng.randbytes(600_000))
        store, _ = Store.init(os.path.join(work, "store"))
        records = b"".join(b'{"type":"message","n":%d,"text":"hello %d"}\n' % (i, i) for i in range(5))
        store.history.append("main", records)
        store.checkpoints.commit(ws, "seed")
        store.history.append("main", b'{"type":"tool_call","name":"ls"}\n')
        store.checkpoints.commit(ws, "seed 2")
        # A segment that copies records (a Codex fork's copy of its parent, FORMAT.md 5.6).
        from agentcas.api.history import SessionAppend
        from agentcas.lineage import rollout
        stamped = b"".join(b'{"timestamp":"2026-11-30T10:00:%02d.000Z","n":%d,"text":"%s"}\n'
                           % (i, i, b"x" * 300) for i in range(5))
        store.history.ingest([SessionAppend("parent", stamped)])
        store.history.ingest([SessionAppend("fork", stamped.replace(b"10:00:", b"11:00:"), copies=rollout.CopyClaim(
            store.threads.get("parent").history, 0, 5))])
        key = keys.generate()
        key_dir = os.path.join(work, "keys")
        keys.write_keypair("alice", key_dir, key)
        for name in ("alice.key", "alice.pub"):
            with open(os.path.join(key_dir, name), "rb") as handle:
                seed("private_key" if name.endswith(".key") else "public_key", handle.read())
        seed("public_key", b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x@y\n")
        signed = envelope.sign(key, store.resolve("main"), "main")
        seed("envelope", signed.encode())
        with store.environment.reader() as txn:
            for _, value in txn.scan("objects"):
                value = bytes(value)
                kind, data = framing.unframe(value)
                if len(value) <= 4096:
                    seed("framing", value)
                if kind in KINDS:
                    seed(KINDS[kind], data)
                    seed("encoding", data)
        bundle_path = os.path.join(work, "main.bundle")
        store.remotes.export_bundle("main", bundle_path, os.path.join(key_dir, "alice.key"))
        with open(bundle_path, "rb") as handle:
            whole = handle.read()
        (length,) = U32.unpack(whole[len(MAGIC):len(MAGIC) + 4])
        seed("manifest", whole[len(MAGIC) + 4:len(MAGIC) + 4 + length])
        seed("encoding", whole[len(MAGIC) + 4:len(MAGIC) + 4 + length])
        # Bundles: the big one (600 KB of chunks) is not a seed; a thread without it is.
        os.unlink(os.path.join(ws, "sub", "data.bin"))
        for thread in ("small", "small-signed"):
            store.history.append(thread, records)
            store.checkpoints.commit(ws, "small", thread=thread)
            path = os.path.join(work, thread + ".bundle")
            key = os.path.join(key_dir, "alice.key") if "signed" in thread else None
            store.remotes.export_bundle(thread, path, key)
            with open(path, "rb") as handle:
                seed("bundle", handle.read())
        seed("rollout", records)
        seed("rollout", b'{"a":1}\n{"b":[1,2,{"c":null}]}\n{"unterminated":true}')
        seed("rollout", b"\xef\xbb\xbf" + b'{"bom":1}\r\n')
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
