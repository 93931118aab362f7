"""A full disk, a failing device, a read-only mount: one clear line, exit 1, nothing changed.

Real file systems where the machine can make them (a 2 MiB tmpfs, remounted read-only;
this needs root, else the tests skip with the reason), and a fault-injecting LD_PRELOAD
shim where no device here can produce the error (EIO from every write and sync of one
file, so LMDB's own C code meets it).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import lmdb
import pytest

from agentcas.cas import system_errors
from agentcas.cas.lmdb_store import store_failure

from support.cli import run_cli
from support.store_state import store_rows


def _mount(path, *options) -> None:
    proc = subprocess.run(["mount", *options, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip() or 'mount failed'}; needs root)")


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs at tmp_path/small, unmounted afterwards."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "small"
    path.mkdir()
    _mount(path, "-t", "tmpfs", "-o", "size=2m", "tmpfs")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def big_workspace(tmp_path, size: int = 3 << 20):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(size))  # random: zstd cannot shrink it below the disk
    (ws / "note.txt").write_text("hello\n")
    return ws


def test_commit_into_a_store_on_a_full_disk(small_disk, tmp_path):
    store = small_disk / "store"
    assert run_cli("init", store).code == 0
    ws = big_workspace(tmp_path)
    before = store_rows(store)
    result = run_cli("commit", ws, "-m", "too big", store=store)
    assert result.code == 1, result
    assert result.err == (f"agentcas: error: no space left on device writing the store at {store}; "
                          "nothing was changed\n")
    assert store_rows(store) == before
    assert run_cli("fsck", store=store).code == 0
    (ws / "big.bin").unlink()
    assert run_cli("commit", ws, "-m", "fits", store=store).code == 0  # the store still works


def test_checkout_onto_a_full_disk(small_disk, tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", big_workspace(tmp_path), "-m", "big", store=store).code == 0
    dest = small_disk / "dest"
    result = run_cli("checkout", "main", dest, store=store)
    assert result.code == 1, result
    assert result.err == f"agentcas: error: no space left on device writing {dest}; nothing was created\n"
    assert os.listdir(small_disk) == []  # neither DEST nor its temporary sibling


def test_export_onto_a_full_disk(small_disk, tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", big_workspace(tmp_path), "-m", "big", store=store).code == 0
    bundle = small_disk / "out.bundle"
    result = run_cli("export", "main", "-o", bundle, store=store)
    assert result.code == 1, result
    assert "no space left on device writing the bundle" in result.err and "no bundle was written" in result.err
    assert os.listdir(small_disk) == []


def test_init_on_a_read_only_file_system(small_disk):
    (small_disk / "existing").mkdir()
    _mount(small_disk, "-o", "remount,ro")
    for target in (small_disk / "new", small_disk / "existing"):
        result = run_cli("init", target)
        assert result.code == 1, result
        assert result.err == (f"agentcas: error: read-only file system creating a store in {target}; "
                              "nothing was created\n")
    assert sorted(os.listdir(small_disk)) == ["existing"] and os.listdir(small_disk / "existing") == []


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* EIO from every write and sync of files whose path starts with $AGENTCAS_TEST_EIO_FILE. */
static int faulty(int fd) {
    const char *want = getenv("AGENTCAS_TEST_EIO_FILE");
    char link[64], path[4096];
    ssize_t n;
    if (!want) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    return strncmp(path, want, strlen(want)) == 0;
}
#define FAIL(fd) do { if (faulty(fd)) { errno = EIO; return -1; } } while (0)
#define REAL(fn) static __typeof__(fn) *real = 0; if (!real) real = dlsym(RTLD_NEXT, #fn)

ssize_t write(int fd, const void *b, size_t n) { REAL(write); FAIL(fd); return real(fd, b, n); }
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) { REAL(pwrite); FAIL(fd); return real(fd, b, n, o); }
ssize_t pwrite64(int fd, const void *b, size_t n, off64_t o) { REAL(pwrite64); FAIL(fd); return real(fd, b, n, o); }
ssize_t writev(int fd, const struct iovec *v, int c) { REAL(writev); FAIL(fd); return real(fd, v, c); }
ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) { REAL(pwritev); FAIL(fd); return real(fd, v, c, o); }
ssize_t pwritev64(int fd, const struct iovec *v, int c, off64_t o) { REAL(pwritev64); FAIL(fd); return real(fd, v, c, o); }
int fsync(int fd) { REAL(fsync); FAIL(fd); return real(fd); }
int fdatasync(int fd) { REAL(fdatasync); FAIL(fd); return real(fd); }
"""


@pytest.fixture(scope="module")
def eio_shim(tmp_path_factory):
    """A shared object that fails writes to one file with EIO (compiled here with cc)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the EIO fault-injecting shim")
    where = tmp_path_factory.mktemp("shim")
    (where / "eio.c").write_text(SHIM)
    proc = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(where / "eio.so"), str(where / "eio.c"),
                           "-ldl"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot build the EIO shim: {proc.stderr.strip()[:200]}")
    return where / "eio.so"


def test_an_io_error_writing_the_store(eio_shim, tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    ws = big_workspace(tmp_path, 100_000)
    before = store_rows(store)
    env = {"LD_PRELOAD": str(eio_shim), "AGENTCAS_TEST_EIO_FILE": str(store / "data.mdb")}
    result = run_cli("commit", ws, "-m", "eio", store=store, env=env)
    assert result.code == 1, result
    assert result.err.startswith("agentcas: error: input/output error")
    assert f"the store at {store}; nothing was changed" in result.err and "internal error" not in result.err
    assert store_rows(store) == before
    assert run_cli("fsck", store=store).code == 0
    assert run_cli("commit", ws, "-m", "after the fault", store=store).code == 0


def test_an_io_error_writing_a_checkout(eio_shim, tmp_path):
    """EIO on the files of a checkout (its hidden temporary sibling): DEST never appears."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", big_workspace(tmp_path, 100_000), "-m", "x", store=store).code == 0
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "dest"
    result = run_cli("checkout", "main", dest, store=store,
                     env={"LD_PRELOAD": str(eio_shim), "AGENTCAS_TEST_EIO_FILE": str(out / ".dest.agentcas-")})
    assert result.code == 1, result
    assert result.err == f"agentcas: error: input/output error (the device or file system reported a failure) " \
                         f"writing {dest}; nothing was created\n"
    assert os.listdir(out) == []


@pytest.mark.parametrize("exc, kind, text", [
    (lmdb.DiskError("mdb_txn_commit: No space left on device"), system_errors.NoSpace, "no space left on device"),
    (lmdb.Error("mdb_txn_commit: Input/output error"), system_errors.DeviceFailure, "input/output error"),
    (lmdb.Error(f"mdb_env_open: {os.strerror(errno.EDQUOT)}"), system_errors.NoSpace, "disk quota exceeded"),
    (lmdb.Error(f"mdb_env_open: {os.strerror(errno.EROFS)}"), system_errors.ReadOnlyFileSystem, "read-only"),
    (lmdb.ReadonlyError("mdb_put: Permission denied"), system_errors.PermissionRefused, "permission denied"),
    (lmdb.MemoryError("mdb_txn_begin: Cannot allocate memory"), system_errors.ResourceExhausted, "not enough memory"),
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), system_errors.NoSpace, "disk quota exceeded"),
    (OSError(errno.EIO, os.strerror(errno.EIO)), system_errors.DeviceFailure, "input/output error"),
])
def test_every_error_class_a_user_can_cause_has_one_clear_message(exc, kind, text):
    failure = store_failure(exc, "/srv/store")
    assert isinstance(failure, kind) and failure.exit_code == 1
    assert str(failure) == f"{text}{str(failure)[len(text):]}"
    assert str(failure).endswith("writing the store at /srv/store; nothing was changed")


def test_the_cli_turns_a_stray_os_error_into_one_line(tmp_path):
    from agentcas.cli import _system_failure
    failure = _system_failure(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x")))
    assert str(failure) == f"no space left on device at {tmp_path / 'x'}"
    assert _system_failure(ValueError("a bug")) is None


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs at tmp_path/tiny, unmounted afterwards."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "tiny"
    path.mkdir()
    _mount(path, "-t", "tmpfs", "-o", "size=64k", "tmpfs")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(disk, leave: int) -> None:
    """Write a ballast file leaving about `leave` bytes free on `disk` (0: none at all)."""
    ballast = disk / "ballast"
    ballast.unlink(missing_ok=True)
    with open(ballast, "wb", buffering=0) as out:
        try:
            while True:
                out.write(bytes(4096))
        except OSError:
            pass
    os.truncate(ballast, max(0, ballast.stat().st_size - leave))


def test_init_on_a_full_disk_is_whole_or_nothing(tiny_disk):
    """At 0 bytes free init died by SIGBUS (LMDB's lock file is mapped) and left a directory
    holding only lock.mdb, which every later command called "not an agentcas store"."""
    outcomes = set()
    for leave in range(0, 64 << 10, 4 << 10):
        _fill(tiny_disk, leave)
        for target in ("new", "existing"):
            store = tiny_disk / target
            if target == "existing":
                store.mkdir(exist_ok=True)
            result = run_cli("init", store)
            if result.code == 0:
                outcomes.add("store")
                assert run_cli("fsck", store=store).code == 0
                shutil.rmtree(store)
                continue
            outcomes.add("refused")
            assert result.code == 1, (leave, result)
            assert result.err.startswith("agentcas: error: no space left on device ") and str(store) in result.err
            assert len(result.err.splitlines()) == 1, result
            # Nothing left: no directory that was not there, nothing in the one that was.
            if target == "new":
                assert not store.exists(), (leave, os.listdir(store))
            else:
                assert os.listdir(store) == [], (leave, os.listdir(store))
                store.rmdir()
    assert outcomes == {"store", "refused"}  # the walk crossed the point where init fits


def test_keygen_on_a_full_disk_names_the_file_and_leaves_nothing(tiny_disk):
    _fill(tiny_disk, 0)
    out_dir = tiny_disk / "keys"
    result = run_cli("keygen", "alice", "--out", out_dir)
    assert result.code == 1, result
    assert len(result.err.splitlines()) == 1, result
    # The directory itself may be refused, or its first file: either is named.
    assert result.err.startswith("agentcas: error: no space left on device ")
    assert str(out_dir) in result.err and " at a file" not in result.err
    assert sorted(os.listdir(tiny_disk)) == ["ballast"]
    # Room for a directory or a file, not for all: whatever fails, no key file is left and
    # no directory keygen made (an existing one stays, empty).
    _fill(tiny_disk, 6 << 10)
    out_dir.mkdir()
    (tiny_disk / "made").mkdir()
    refused = 0
    for name, target, parent in (("bob", out_dir, out_dir), ("carol", tiny_disk / "made" / "a" / "b", tiny_disk / "made")):
        result = run_cli("keygen", name, "--out", target)
        if result.code == 0:
            continue
        refused += 1
        assert result.code == 1 and len(result.err.splitlines()) == 1, result
        assert result.err.startswith("agentcas: error: no space left on device ") and str(parent) in result.err
        assert os.listdir(parent) == [], result
    assert refused
