"""Exchange numbers: hand a checkpoint to another store, against restic and borg.

On 1 GiB in 1,000 files of incompressible bytes (--quick: 64 MiB in 100), already
committed/backed up in a source repository (not timed), we time moving it to a second
repository the way each tool does it:
  - agentcas: `export main -o BUNDLE --sign KEY` then `import BUNDLE` into a fresh store
    that trusts the key (full verification: every hash, closure, signature, two passes);
  - restic: `restic -r B copy --from-repo A` (B initialised with A's chunker parameters);
  - borg 1.2 has no repository-to-repository transfer (that is borg 2's `transfer`), so
    its single-file hand-over is `borg export-tar A::x FILE.tar` + `borg import-tar B::x`.
Times are wall-clock through the real CLIs. The target: agentcas within 2x of restic
copy or of borg's transfer. Also reported: `verify BUNDLE` alone and the bundle size.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402
from datasets import random_tree  # noqa: E402

GIB = 1 << 30


def timed(cmd, env) -> float:
    return h.run(cmd, env=env)


def bench(total: int, files: int) -> dict:
    r: dict = {"total": total, "files": files}
    with h.work_dir("exchange") as work:
        env = h.env_for(work)
        data = os.path.join(work, "data")
        os.makedirs(data)
        h.progress(f"exchange: generating {h.fmt_bytes(total)} in {files} files")
        random_tree(data, total, files)
        r["data_bytes"] = h.apparent_bytes(data)

        # agentcas
        a, b, keys = (os.path.join(work, n) for n in ("src", "dst", "keys"))
        bundle = os.path.join(work, "main.bundle")
        h.run([h.AGENTCAS, "init", a], env=env)
        h.run([h.AGENTCAS, "init", b], env=env)
        h.progress("exchange: agentcas commit (setup, not timed)")
        h.run([h.AGENTCAS, "--store", a, "commit", data, "-m", "bench"], env=env)
        h.run([h.AGENTCAS, "keygen", "bench", "--out", keys], env=env)
        h.run([h.AGENTCAS, "--store", b, "trust", "add", "bench", os.path.join(keys, "bench.pub")], env=env)
        h.progress("exchange: agentcas export / verify / import")
        r["agentcas_export"] = timed([h.AGENTCAS, "--store", a, "export", "main", "-o", bundle,
                                      "--sign", os.path.join(keys, "bench.key")], env)
        r["bundle_bytes"] = os.path.getsize(bundle)
        r["agentcas_verify"] = timed([h.AGENTCAS, "--store", b, "verify", bundle], env)
        r["agentcas_import"], r["import_rss"] = timed_rss([h.AGENTCAS, "--store", b, "import", bundle], env)
        r["agentcas"] = r["agentcas_export"] + r["agentcas_import"]
        out = os.path.join(work, "restored")
        h.run([h.AGENTCAS, "--store", b, "checkout", "main", out], env=env)
        r["restored_ok"] = h.output(["b3sum", "--no-names", *sorted(_files(out))], env=env) == \
            h.output(["b3sum", "--no-names", *sorted(_files(data))], env=env)
        for path in (bundle, out, a, b):
            h.run(["rm", "-rf", path], env=env)

        # restic
        ra, rb = os.path.join(work, "restic-a"), os.path.join(work, "restic-b")
        renv = dict(env, RESTIC_FROM_PASSWORD=env["RESTIC_PASSWORD"])
        h.progress("exchange: restic backup (setup, not timed) and copy")
        h.run(["restic", "-q", "-r", ra, "init"], env=renv)
        h.run(["restic", "-q", "-r", ra, "backup", "--no-scan", data] if _restic_has_no_scan(renv)
              else ["restic", "-q", "-r", ra, "backup", data], env=renv)
        h.run(["restic", "-q", "-r", rb, "init", "--from-repo", ra, "--copy-chunker-params"], env=renv)
        r["restic"] = timed(["restic", "-q", "-r", rb, "copy", "--from-repo", ra], renv)
        h.run(["rm", "-rf", ra, rb], env=env)

        # borg
        ba, bb, tar = os.path.join(work, "borg-a"), os.path.join(work, "borg-b"), os.path.join(work, "x.tar")
        h.progress("exchange: borg create (setup, not timed), export-tar, import-tar")
        h.run(["borg", "init", "-e", "none", ba], env=env)
        h.run(["borg", "init", "-e", "none", bb], env=env)
        h.run(["borg", "create", f"{ba}::x", "."], env=env, cwd=data)
        r["borg_export"] = timed(["borg", "export-tar", f"{ba}::x", tar], env)
        r["borg_import"] = timed(["borg", "import-tar", f"{bb}::x", tar], env)
        r["borg"] = r["borg_export"] + r["borg_import"]
        r["tar_bytes"] = os.path.getsize(tar)
    return r


def timed_rss(cmd, env) -> tuple[float, dict]:
    """Wall time and peak resident memory of a command, sampled from /proc every 10 ms.

    RssAnon is the process's own memory (heap, buffers); RssFile counts pages of mapped
    files, here mostly the store's LMDB map, which is page cache, not working memory.
    """
    import re
    import subprocess
    peak = {"RssAnon": 0, "RssFile": 0}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as handle:
                status = handle.read()
            for key in peak:
                found = re.search(rf"{key}:\s+(\d+) kB", status)
                if found:
                    peak[key] = max(peak[key], int(found.group(1)) * 1024)
        except OSError:
            pass
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise h.ToolFailed(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.read()[-400:]}")
    return elapsed, peak


def _files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(root) for f in names]


def _restic_has_no_scan(env) -> bool:
    import subprocess
    help_text = subprocess.run(["restic", "backup", "--help"], capture_output=True, text=True, env=env).stdout
    return "--no-scan" in help_text


def report(r: dict) -> None:
    a = r["agentcas"]
    rows = [
        ["agentcas export + import (signed, verified)", h.fmt_time(a), "1.00×",
         h.fmt_bytes(r["bundle_bytes"]), f"export {h.fmt_time(r['agentcas_export'])}, import {h.fmt_time(r['agentcas_import'])} "
         f"(peak anon {h.fmt_bytes(r['import_rss']['RssAnon'])}, mapped store "
         f"{h.fmt_bytes(r['import_rss']['RssFile'])})"],
        ["agentcas verify BUNDLE (no write)", h.fmt_time(r["agentcas_verify"]), "-", "-", ""],
        ["restic copy (repo to repo)", h.fmt_time(r["restic"]), h.fmt_ratio(h.ratio(a, r["restic"])), "-", ""],
        ["borg export-tar + import-tar", h.fmt_time(r["borg"]), h.fmt_ratio(h.ratio(a, r["borg"])),
         h.fmt_bytes(r["tar_bytes"]), f"export {h.fmt_time(r['borg_export'])}, import {h.fmt_time(r['borg_import'])}"],
    ]
    h.table(f"Exchange: hand over {h.fmt_bytes(r['total'])} in {r['files']} files (random bytes)",
            ["tool", "time", "agentcas / tool", "file handed over", "detail"], rows,
            [f"Restored files identical to the source (b3sum): {'yes' if r['restored_ok'] else 'NO'}. "
             f"{h.load_note()}. {h.machine_note()}."])
    best = min(r["restic"], r["borg"])
    h.table("Exchange target", ["target", "measured", "met"], [
        ["export + import within 2× of restic copy or borg transfer",
         f"{h.fmt_time(a)} vs restic {h.fmt_time(r['restic'])}, borg {h.fmt_time(r['borg'])}",
         h.verdict(a <= 2 * max(r["restic"], r["borg"]))],
        ["... and within 2× of the faster of the two", f"{h.fmt_time(a)} vs {h.fmt_time(best)}",
         h.verdict(a <= 2 * best)],
    ])


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    total, files = (64 << 20, 100) if quick else (GIB, 1000)
    started = time.perf_counter()
    report(bench(total, files))
    h.progress(f"exchange: done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
