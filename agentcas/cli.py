"""The `agentcas` command: parse, call the Store API, print. No storage logic here.

Errors map to exit codes in one place (`main`): AgentcasError subclasses carry their
code (1 error, 2 usage, 3 conflict, 4 integrity/trust); click usage errors are 2.
Every error is one line on stderr, `agentcas: error: ...`; AGENTCAS_DEBUG=1 shows
the traceback. With --json each command prints one JSON document on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import click

from agentcas.errors import AgentcasError
from agentcas.repository import STORE_DIR, Store, find_store


class Context:
    def __init__(self, store_path: str | None, as_json: bool):
        self.store_path = store_path
        self.as_json = as_json
        self._store = None

    def store(self) -> Store:
        if self._store is None:
            path = self.store_path or os.environ.get("AGENTCAS_STORE") or find_store()
            if not path:
                raise AgentcasError(f"no store found: use --store DIR, set AGENTCAS_STORE, "
                                    f"or run 'agentcas init' to create ./{STORE_DIR}")
            self._store = Store.open(path)
        return self._store

    def emit(self, doc, text: str | None = None) -> None:
        """Print `doc` as JSON with --json, else `text` (or a readable rendering of doc)."""
        if self.as_json:
            click.echo(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True))
        elif text is not None:
            click.echo(text)


pass_ctx = click.make_pass_decorator(Context)


class Progress:
    """A rich progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, label: str):
        self.label = label
        self.bar = None
        self.task = None

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress as RichProgress, \
                TransferSpeedColumn, TimeRemainingColumn
            self.bar = RichProgress("[progress.description]{task.description}", BarColumn(),
                                    DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                    console=Console(stderr=True), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=None)
        return self

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", "store_path", metavar="DIR", help="Store directory (else $AGENTCAS_STORE, else ./.agentcas upward).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.version_option(package_name="agentcas")
@click.pass_context
def cli(ctx, store_path, as_json):
    """agentcas: content-addressed checkpoints with Git-like lineage for AI-agent state."""
    ctx.obj = Context(store_path, as_json)


@cli.command()
@click.argument("directory", required=False)
@pass_ctx
def init(ctx, directory):
    """Create a store in DIRECTORY (default ./.agentcas, or --store)."""
    path = directory or ctx.store_path or os.environ.get("AGENTCAS_STORE") or STORE_DIR
    store, created = Store.init(path)
    ctx.emit({"store": store.path, "created": created},
             f"{'Initialised empty' if created else 'Reinitialised existing'} agentcas store in {store.path}")


@cli.command()
@click.argument("path", type=click.Path(file_okay=False))
@click.option("-m", "--message", "reason", required=True, help="Why this checkpoint (1..512 characters).")
@click.option("--thread", default="main", show_default=True)
@click.option("--rollout", "rollout_file", type=click.Path(dir_okay=False), help="Growing JSONL rollout file; its new tail is appended.")
@click.option("--expect", metavar="REV", help="Commit only if the thread is at REV (else exit 3).")
@click.option("--allow-secret", "allow_secrets", multiple=True, metavar="GLOB", help="Store files matching GLOB even if they look like secrets.")
@pass_ctx
def commit(ctx, path, reason, thread, rollout_file, expect, allow_secrets):
    """Snapshot the workspace PATH as a checkpoint on a thread."""
    with Progress("commit") as progress:
        result = ctx.store().commit(path, reason, thread, rollout_file, expect, allow_secrets,
                                    progress=progress)
    extra = f", {result['appended_records']} rollout records" if rollout_file else ""
    ctx.emit(result, f"[{thread} {result['checkpoint'][:12]}] {reason}\n"
                     f" {result['files']} files, {result['bytes']} bytes ({result['cached_files']} unchanged), "
                     f"{result['new_objects']} new objects, {result['new_bytes']} bytes stored{extra}")


@cli.command()
@click.argument("rev")
@click.argument("dest", type=click.Path())
@pass_ctx
def checkout(ctx, rev, dest):
    """Restore checkpoint REV into DEST, which must not exist."""
    with Progress("checkout") as progress:
        result = ctx.store().checkout(rev, dest, progress=progress)
    ctx.emit(result, f"Checked out {result['checkpoint'][:12]} into {result['dest']} ({result['files']} files)")


@cli.command()
@click.argument("rev")
@click.option("--files", is_flag=True, help="List every file with size, mode and id.")
@pass_ctx
def show(ctx, rev, files):
    """Show a checkpoint."""
    doc = ctx.store().show(rev, files)
    lines = [f"checkpoint {doc['checkpoint']}", f"thread     {doc['thread']}", f"tree       {doc['tree']}"]
    lines += [f"parent     {p}" for p in doc["parents"]]
    lines += [f"author     {doc['author']}", f"date       {doc['created_at']}",
              f"history    seq {doc['history']['seq']}, {doc['history']['offset']} bytes, "
              f"digest {doc['history']['digest'][:16]}",
              f"runtime    " + ", ".join(f"{k} {v}" for k, v in sorted(doc["runtime"].items())),
              "", "    " + doc["reason"]]
    if files:
        lines.append("")
        lines += [f"{f['mode']} {f['size']:>12} {f['id'][:16]}  {f['path']}" for f in doc["files"]]
    ctx.emit(doc, "\n".join(lines))


@cli.command()
@click.argument("thread", required=False)
@click.option("-n", "limit", type=click.IntRange(min=0), help="Show at most N checkpoints.")
@pass_ctx
def log(ctx, thread, limit):
    """List a thread's checkpoints, newest first, with their history positions."""
    entries = ctx.store().log(thread, limit)
    text = "\n".join(f"{e['checkpoint'][:12]} {e['created_at'][:19]} seq {e['history']['seq']:>7}  {e['reason']}"
                     for e in entries)
    ctx.emit({"thread": thread or "main", "checkpoints": entries}, text)


@cli.command()
@click.argument("rev1")
@click.argument("rev2")
@pass_ctx
def diff(ctx, rev1, rev2):
    """Files added, removed and changed, and rollout records added, from REV1 to REV2."""
    d = ctx.store().diff(rev1, rev2)
    lines = [f"A {f['path']} ({f['size']} bytes)" for f in d["added"]]
    lines += [f"D {f['path']} ({f['size']} bytes)" for f in d["removed"]]
    lines += [f"M {f['path']} ({f['old_size']} -> {f['new_size']} bytes)" for f in d["changed"]]
    r = d["records"]
    lines.append(f"rollout: {r['added']} records added (seq {r['added_range'][0]}..{r['added_range'][1]})"
                 + (f", {r['removed']} records not in {rev2} (histories diverge at seq {r['common']})"
                    if r["removed"] else ""))
    ctx.emit(d, "\n".join(lines))


@cli.command()
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "delete", is_flag=True, help="Delete thread NAME (its reflog goes with it).")
@pass_ctx
def branch(ctx, name, rev, delete):
    """List threads, create thread NAME at REV, or delete one with -d."""
    store = ctx.store()
    if delete:
        if not name:
            raise click.UsageError("branch -d needs a thread name")
        result = store.delete_thread(name)
        ctx.emit(result, f"Deleted thread {name}")
    elif name:
        result = store.create_thread(name, rev)
        ctx.emit(result, f"Created thread {name} at {result['checkpoint'][:12]}")
    else:
        rows = store.threads()
        text = "\n".join(f"{r['thread']:<24} {(r['checkpoint'] or '-')[:12]:<12} {r['history']['seq']:>8} records"
                         for r in rows)
        ctx.emit({"threads": rows}, text)


@cli.command()
@click.argument("thread")
@click.option("-n", "limit", type=click.IntRange(min=0))
@pass_ctx
def reflog(ctx, thread, limit):
    """Every move of a thread's ref, newest first (THREAD@{N})."""
    entries = ctx.store().reflog(thread, limit)
    lines = []
    for i, e in enumerate(entries):
        cp = (e["new"]["checkpoint"] or "-")[:12] if e["new"] else "-"
        lines.append(f"{cp} {thread}@{{{i}}}: {e['action']}: {e['message']} (seq {e['new']['history']['seq']})")
    ctx.emit({"thread": thread, "entries": entries}, "\n".join(lines))


@cli.command()
@click.argument("source")
@click.argument("name")
@click.option("--at", "at", type=click.IntRange(min=0), metavar="SEQ", help="Share only the first SEQ records.")
@pass_ctx
def fork(ctx, source, name, at):
    """New thread NAME sharing SOURCE's history (or its first SEQ records) without copying."""
    result = ctx.store().fork(source, name, at)
    ctx.emit(result, f"Forked {name} from {source} at seq {result['seq']}"
                     f" (files of {result['checkpoint'][:12] if result['checkpoint'] else 'no checkpoint'})")


@cli.command()
@click.argument("thread")
@click.argument("rev")
@click.option("--expect", metavar="REV", help="Revert only if the thread is at REV (else exit 3).")
@pass_ctx
def revert(ctx, thread, rev, expect):
    """Point THREAD at checkpoint REV; its old head stays in the reflog (THREAD@{1})."""
    result = ctx.store().revert(thread, rev, expect)
    if not ctx.as_json:
        for note in result["notes"]:
            click.echo(f"agentcas: note: {note}", err=True)
    ctx.emit(result, f"Reverted {thread} to {result['checkpoint'][:12]} "
                     f"(was {(result['previous'] or '-')[:12]}, now seq {result['history']['seq']})")


@cli.command()
@click.argument("thread", required=False)
@pass_ctx
def lineage(ctx, thread):
    """The tree of threads and their fork points."""
    doc = ctx.store().lineage(thread)
    lines = []

    def render(node, depth):
        origin = node["forked_from"]
        where = f"  (fork of {origin['thread']} at seq {origin['seq']})" if origin else ""
        lines.append(f"{'  ' * depth}{node['thread']}  {node['records']} records{where}")
        for child in node["children"]:
            render(child, depth + 1)

    for root in doc["threads"]:
        render(root, 0)
    ctx.emit(doc, "\n".join(lines))


@cli.group()
def rollout():
    """Append to and read a thread's JSONL history."""


@rollout.command("append")
@click.argument("thread")
@click.argument("source", required=False, default="-")
@pass_ctx
def rollout_append(ctx, thread, source):
    """Append JSONL records from FILE (or stdin) to THREAD, all or nothing."""
    if source == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(source, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise AgentcasError(f"cannot read {source}: {exc.strerror}") from None
    result = ctx.store().rollout_append(thread, data)
    ctx.emit(result, f"Appended {result['appended']} records to {thread} "
                     f"(seq {result['first_seq']}..{result['history']['seq'] - 1})")


@rollout.command("cat")
@click.argument("thread")
@click.option("--from", "start", type=int, default=0, metavar="SEQ")
@click.option("--to", "stop", type=int, default=None, metavar="SEQ")
@pass_ctx
def rollout_cat(ctx, thread, start, stop):
    """Print records FROM <= seq < TO of THREAD's history (or a checkpoint's), exactly as appended."""
    pieces = ctx.store().rollout_read(thread, start, stop)
    if ctx.as_json:
        records = [json.loads(line) for piece in pieces for line in piece.splitlines()]
        ctx.emit({"thread": thread, "from": start, "records": records})
        return
    out = sys.stdout.buffer
    for piece in pieces:
        out.write(piece)
    out.flush()


# --- commands of later layers register below ------------------------------------------------

# --- gc and fsck (gc helper) ----------------------------------------------------------------
# (gc helper: commands go here)

# --- keys, trust, signatures, bundles, remotes (exchange helper) ----------------------------
# (exchange helper: commands go here)

# --- drill (exchange helper) -----------------------------------------------------------------
# (drill: commands go here)


def main(argv=None) -> int:
    debug = os.environ.get("AGENTCAS_DEBUG") == "1"
    try:
        cli.main(args=argv, prog_name="agentcas", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("agentcas: error: aborted", err=True)
        return 1
    except click.ClickException as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"agentcas: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except AgentcasError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"agentcas: error: {_one_line(str(exc))}", err=True)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        click.echo("agentcas: error: interrupted", err=True)
        return 130
    except Exception as exc:  # noqa: BLE001 - last resort: still one line
        if debug:
            traceback.print_exc()
        click.echo(f"agentcas: error: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
                   "(set AGENTCAS_DEBUG=1 for a traceback)", err=True)
        return 1


def _one_line(text: str) -> str:
    return " ".join(text.split())


def entry_point():
    sys.exit(main())
