"""Errors of the machine, not of agentcas: a full disk, a failing device, a read-only mount.

Every OS error a user can cause while agentcas writes (the store, a checkout, a bundle)
becomes one `SystemFailure` subclass with a one-line message saying what happened,
what was being written, and what that left behind:

    no space left on device writing the store at /srv/store; nothing was changed

`from_errno` is the one table from errno to kind and wording. Backends translate their
own exceptions to an errno first (lmdb_store.py for LMDB's classes) and call it; the
CLI sends any OSError that escapes to `from_os_error` as a last resort, so none is
ever printed as an "internal error". All of them exit with code 1 (an error, not
corruption: the bytes that are stored are still intact).
"""

from __future__ import annotations

import errno

from agentcas.errors import AgentcasError


class SystemFailure(AgentcasError):
    """The operating system refused a read or write; `errno` says why."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.errno = code


class NoSpace(SystemFailure):
    """The file system is full, or a disk quota is exhausted."""


class DeviceFailure(SystemFailure):
    """The device reported an I/O error."""


class ReadOnlyFileSystem(SystemFailure):
    """The file system is mounted read-only."""


class PermissionRefused(SystemFailure):
    """The file or directory is not writable (or readable) for this user."""


class ResourceExhausted(SystemFailure):
    """Memory, address space or file descriptors ran out."""


_KINDS: dict[int, tuple[type, str]] = {
    errno.ENOSPC: (NoSpace, "no space left on device"),
    errno.EDQUOT: (NoSpace, "disk quota exceeded"),
    errno.EFBIG: (NoSpace, "file too large for the file system"),
    errno.EIO: (DeviceFailure, "input/output error (the device or file system reported a failure)"),
    errno.EROFS: (ReadOnlyFileSystem, "read-only file system"),
    errno.EACCES: (PermissionRefused, "permission denied"),
    errno.EPERM: (PermissionRefused, "operation not permitted"),
    errno.ENOMEM: (ResourceExhausted, "not enough memory"),
    errno.EMFILE: (ResourceExhausted, "too many open files"),
    errno.ENFILE: (ResourceExhausted, "too many open files in the system"),
    errno.ENAMETOOLONG: (SystemFailure, "file name too long"),
    errno.ENOTDIR: (SystemFailure, "a path component is not a directory"),
    errno.EEXIST: (SystemFailure, "a file is in the way"),
    errno.ENOENT: (SystemFailure, "no such file or directory"),
}


def from_errno(code: int | None, doing: str, outcome: str = "", detail: str = "") -> SystemFailure:
    """The failure for `code` while `doing` ("writing the store at P"), ending with `outcome`
    ("nothing was changed"); an unknown code keeps `detail` (the OS's own text)."""
    if code in _KINDS:
        kind, text = _KINDS[code]
        message = f"{text} {doing}"
    else:
        kind, message = SystemFailure, f"{doing} failed: {detail or 'system error'}"
    return kind(message + (f"; {outcome}" if outcome else ""), code)


def from_os_error(exc: OSError, doing: str | None = None, outcome: str = "") -> SystemFailure:
    """`from_errno` for an OSError; `doing` defaults to naming the file it carries."""
    if doing is None:
        target = exc.filename if exc.filename is not None else "a file"
        doing = f"at {target}"
    return from_errno(exc.errno, doing, outcome, (exc.strerror or str(exc)).lower())
