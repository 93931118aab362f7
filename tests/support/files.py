"""Writing a tree of files from a dict (relative path -> bytes or text)."""

from __future__ import annotations


def write(root, files: dict):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return root
