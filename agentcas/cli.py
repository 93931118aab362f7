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
from typing import TYPE_CHECKING

import click

from agentcas import __version__, gc_defaults
from agentcas.errors import AgentcasError, UsageError
from agentcas.terminal_text import escape_controls

if TYPE_CHECKING:
    from agentcas.repository import Store


class Context:
    def __init__(self, store_path: str | None, as_json: bool, refs: str | None = None):
        self._store: Store | None = None
        # With --json, the command's document: printed by `main` when the command ends, with
        # the failure's `error` and `exit_code` in it if the command failed after making it
        # (scan's findings, ingest's refusals, fsck's problems), so stdout holds one document.
        self.document = None
        self.configure(store_path, as_json, refs)

    def configure(self, store_path: str | None, as_json: bool, refs: str | None) -> None:
        """Take the global options (the group's callback calls this on `main`'s Context)."""
        self.store_path = store_path
        self.as_json = as_json
        self.refs = refs or os.environ.get("AGENTCAS_REFS") or None
        self.refs_flag = refs  # given on the command line ($AGENTCAS_REFS may be set for a whole shell)

    def check_refs(self, path: str) -> None:
        """`--refs` names the refs of an s3:// store; given with a directory store it would
        be ignored, and the user would think the commit went to the team's store."""
        from agentcas.cas.backends import is_shared_url
        if self.refs_flag and not is_shared_url(path):
            raise UsageError(f"--refs is only for an s3://BUCKET/PREFIX store, and {path} is a directory "
                             "store; nothing was done")

    def store(self) -> Store:
        if self._store is None:
            from agentcas.cas import fatal_signals
            fatal_signals.arm()  # a damaged store file: one line and exit 4, not a bus error
            # Lazy: --help, --version and usage errors need no store (~50 ms of imports).
            from agentcas.cas.backends import is_shared_url
            from agentcas.repository import STORE_DIR, Store, find_store
            path = self.store_path or os.environ.get("AGENTCAS_STORE") or find_store()
            if not path:
                raise AgentcasError(f"no store found: use --store DIR, set AGENTCAS_STORE, "
                                    f"or run 'agentcas init' to create ./{STORE_DIR}")
            self.check_refs(path)
            if is_shared_url(path):  # before the request pool's threads start
                from agentcas.cas.blobstore.s3 import cap_malloc_arenas
                cap_malloc_arenas()
            self._store = Store.open(path, refs=self.refs)
        return self._store

    def emit(self, doc, text: str | None = None) -> None:
        """Print `doc` (a typed result, or a document of them) as JSON with --json (when
        the command ends: see `document`), else `text`.

        The one place a command's result becomes output: its JSON is the result's
        `to_json()` (agentcas/result.py), its text what the command rendered from its fields."""
        if self.as_json:
            from agentcas.result import json_value
            self.document = json_value(doc)
        elif text is not None:
            click.echo(escape_controls(text, lines=True))


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
            from rich.progress import BarColumn, DownloadColumn, TimeRemainingColumn, TransferSpeedColumn
            from rich.progress import Progress as RichProgress
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
@click.option("--store", "store_path", metavar="DIR|URL",
              help="Store directory or s3://BUCKET/PREFIX (else $AGENTCAS_STORE, else ./.agentcas upward).")
@click.option("--refs", "refs", metavar="URL",
              help="For an s3:// store: its refs database, postgresql://USER@HOST:PORT/DB (else $AGENTCAS_REFS).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.version_option(__version__)  # not package_name=: reading installed metadata costs ~30 ms
@click.pass_context
def cli(ctx, store_path, refs, as_json):
    """agentcas: content-addressed checkpoints with Git-like lineage for AI-agent state."""
    if isinstance(ctx.obj, Context):  # made by `main`, which reports a failure in its form
        ctx.obj.configure(store_path, as_json or ctx.obj.as_json, refs)
    else:
        ctx.obj = Context(store_path, as_json, refs)


@cli.command()
@click.argument("directory", required=False)
@pass_ctx
def init(ctx, directory):
    """Create a store in DIRECTORY (default ./.agentcas, or --store)."""
    from agentcas.repository import STORE_DIR, Store  # lazy, as in Context.store
    path = directory or ctx.store_path or os.environ.get("AGENTCAS_STORE") or STORE_DIR
    ctx.check_refs(path)
    store, created = Store.init(path, refs=ctx.refs)
    where = store.path or store.url
    ctx.emit({"store": where, "created": created},
             f"{'Initialised empty' if created else 'Reinitialised existing'} agentcas store in {where}")


@cli.command()
@click.argument("path", type=click.Path(file_okay=False))
@click.option("-m", "--message", "reason", required=True, help="Why this checkpoint (1..512 characters).")
@click.option("--thread", default="main", show_default=True)
@click.option("--rollout", "rollout_file", type=click.Path(dir_okay=False),
              help="Growing JSONL rollout file; its new tail is appended.")
@click.option("--expect", metavar="REV", help="Commit only if the thread is at REV (else exit 3).")
@click.option("--allow-secret", "allow_secrets", multiple=True, metavar="GLOB",
              help="Store files matching GLOB even if they look like secrets (':reason': the reason).")
@pass_ctx
def commit(ctx, path, reason, thread, rollout_file, expect, allow_secrets):
    """Snapshot the workspace PATH as a checkpoint on a thread."""
    with Progress("commit") as progress:
        result = ctx.store().checkpoints.commit(path, reason, thread, rollout_file, expect, allow_secrets,
                                                progress=progress)
    extra = f", {result.appended_records} rollout records" if rollout_file else ""
    ctx.emit(result, f"[{thread} {result.checkpoint[:12]}] {reason}\n"
                     f" {result.files} files, {result.bytes} bytes ({result.unchanged_files} unchanged), "
                     f"{result.new_objects} new objects, {result.new_bytes} bytes stored{extra}")


@cli.command()
@click.argument("rev")
@click.argument("dest", type=click.Path())
@pass_ctx
def checkout(ctx, rev, dest):
    """Restore checkpoint REV into DEST, which must not exist."""
    with Progress("checkout") as progress:
        result = ctx.store().checkpoints.checkout(rev, dest, progress=progress)
    written = f" and the rollout file {result.rollout_file}" if result.rollout_file else ""
    ctx.emit(result, f"Checked out {result.checkpoint[:12]} into {result.dest} ({result.files} files{written})")
    if not ctx.as_json:
        _print_open_effects(result.effects, "checkout")


@cli.command()
@click.argument("rev")
@click.option("--files", is_flag=True, help="List every file with size, mode and id.")
@pass_ctx
def show(ctx, rev, files):
    """Show a checkpoint."""
    doc = ctx.store().checkpoints.show(rev, files)
    lines = [f"checkpoint {doc.checkpoint}", f"thread     {doc.thread}", f"tree       {doc.tree}"]
    lines += [f"parent     {p}" for p in doc.parents]
    lines += [f"author     {doc.author}", f"date       {doc.created_at}",
              f"history    seq {doc.history.seq}, {doc.history.offset} bytes, "
              f"digest {doc.history.digest.hex()[:16]}",
              "runtime    " + ", ".join(f"{k} {v}" for k, v in sorted(doc.runtime.items())),
              "", "    " + doc.reason]
    if files:
        lines.append("")
        lines += [f"{f.mode:04o} {f.size:>12} {f.id[:16]}  {f.path}" for f in doc.files]
    ctx.emit(doc, "\n".join(lines))


@cli.command()
@click.argument("thread", required=False)
@click.option("-n", "limit", type=click.IntRange(min=0), help="Show at most N checkpoints.")
@pass_ctx
def log(ctx, thread, limit):
    """List a thread's checkpoints, newest first, with their history positions."""
    entries = ctx.store().threads.log(thread, limit)
    text = "\n".join(f"{e.checkpoint[:12]} {e.created_at[:19]} seq {e.history.seq:>7}  {e.reason}"
                     for e in entries)
    ctx.emit({"thread": thread or "main", "checkpoints": entries}, text)


@cli.command()
@click.argument("rev1")
@click.argument("rev2")
@pass_ctx
def diff(ctx, rev1, rev2):
    """Files added, removed and changed, and rollout records added, from REV1 to REV2."""
    d = ctx.store().checkpoints.diff(rev1, rev2)
    lines = [f"A {f.path} ({f.size} bytes)" for f in d.added]
    lines += [f"D {f.path} ({f.size} bytes)" for f in d.removed]
    lines += [f"M {f.path} ({f.old_size} -> {f.new_size} bytes)" for f in d.changed]
    r = d.records
    lines.append(f"rollout: {r.added} records added (seq {r.added_range[0]}..{r.added_range[1]})"
                 + (f", {r.removed} records not in {rev2} (histories diverge at seq {r.common})"
                    if r.removed else ""))
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
        if rev is not None:   # `branch -d a b` would otherwise delete a, say so, and keep b
            raise click.UsageError(f"branch -d deletes one thread: got {name!r} and {rev!r} (delete each in turn)")
        result = store.threads.delete(name)
        ctx.emit(result, f"Deleted thread {name}")
    elif name is not None:
        result = store.threads.create(name, rev)
        ctx.emit(result, f"Created thread {name} at {result.checkpoint[:12]}")
    else:
        rows = store.threads.list()
        text = "\n".join(f"{r.thread:<24} {(r.checkpoint or '-')[:12]:<12} {r.history.seq:>8} records"
                         for r in rows)
        ctx.emit({"threads": rows}, text)


@cli.command()
@click.argument("thread")
@click.option("-n", "limit", type=click.IntRange(min=0))
@pass_ctx
def reflog(ctx, thread, limit):
    """Every move of a thread's ref, newest first (THREAD@{N})."""
    entries = ctx.store().threads.reflog(thread, limit)
    lines = []
    for item in entries:
        e = item.entry
        cp = (e.new.checkpoint.hex() if e.new.checkpoint else "-")[:12] if e.new else "-"
        lines.append(f"{cp} {item.rev}: {e.action}: {e.message} (seq {e.new.history.seq})")
    ctx.emit({"thread": thread, "entries": entries}, "\n".join(lines))


@cli.command()
@click.argument("source")
@click.argument("name")
@click.option("--at", "at", type=click.IntRange(min=0), metavar="SEQ", help="Share only the first SEQ records.")
@pass_ctx
def fork(ctx, source, name, at):
    """New thread NAME sharing SOURCE's history (or its first SEQ records) without copying."""
    result = ctx.store().threads.fork(source, name, at)
    ctx.emit(result, f"Forked {name} from {source} at seq {result.seq}"
                     f" (files of {result.checkpoint[:12] if result.checkpoint else 'no checkpoint'})")


@cli.command()
@click.argument("thread")
@click.argument("rev")
@click.option("--expect", metavar="REV", help="Revert only if the thread is at REV (else exit 3).")
@pass_ctx
def revert(ctx, thread, rev, expect):
    """Point THREAD at checkpoint REV; its old head stays in the reflog (THREAD@{1})."""
    result = ctx.store().threads.revert(thread, rev, expect)
    if not ctx.as_json:
        for note in result.notes:
            click.echo(f"agentcas: note: {_one_line(note)}", err=True)
    ctx.emit(result, f"Reverted {thread} to {result.checkpoint[:12]} "
                     f"(was {(result.previous or '-')[:12]}, now seq {result.history.seq})")
    if not ctx.as_json:
        _print_open_effects(result.effects, "revert")


def _print_open_effects(doc, verb: str) -> None:
    """On stderr: the pending/unknown effects after a revert's or checkout's target, not undone."""
    if not doc or not doc.count:
        return
    click.echo(f"agentcas: note: {doc.count} pending or unknown effects were recorded after the "
               f"target (seq >= {doc.since_seq}); {verb} undid none of them:", err=True)
    for e in doc.effects:
        click.echo(escape_controls(f"  {e.state:<8} {e.rollback:<13} {e.id}  {e.kind} {e.target!r}"
                                   f" (seq {e.first_seq})"), err=True)
    if doc.has_more:
        click.echo("  ... and more: agentcas effects THREAD --since REV --state pending,unknown", err=True)


@cli.command()
@click.argument("thread", required=False)
@pass_ctx
def lineage(ctx, thread):
    """The tree of threads and their fork points."""
    doc = ctx.store().threads.lineage(thread)
    lines = []

    def render(node, depth):
        origin = node.forked_from
        where = f"  (fork of {origin.thread} at seq {origin.seq})" if origin else ""
        lines.append(f"{'  ' * depth}{node.thread}  {node.records} records{where}")
        for child in node.children:
            render(child, depth + 1)

    for root in doc.threads:
        render(root, 0)
    ctx.emit(doc, "\n".join(lines))


@cli.group(invoke_without_command=True)
@click.pass_context
def effect(click_ctx):
    """Record external effects (requests sent, money spent) as history: evidence, never undone."""
    _without_subcommand(click_ctx)


@effect.command("add")
@click.argument("thread")
@click.option("--kind", help="What sort of effect (http.request, file.write, payment, ...).")
@click.option("--target", help="What it acted on (a URL, a path, an account).")
@click.option("--state", required=True, help="pending | done | failed | unknown.")
@click.option("--rollback", help="irreversible | compensatable | rollbackable.")
@click.option("--provider", help="Who carried it out (a service, a tool).")
@click.option("--operation", help="The provider's operation name.")
@click.option("--id", "effect_id", metavar="ID", help="The effect's id (default: generated). With only "
              "--state: record a new state of the existing effect ID.")
@pass_ctx
def effect_add(ctx, thread, kind, target, state, rollback, provider, operation, effect_id):
    """Append an effect record (or a new state of effect --id) to THREAD's history."""
    result = ctx.store().effects.add(thread, state, kind, target, rollback, provider, operation, effect_id)
    what = "effect" if result.new else "state of effect"
    ctx.emit(result, result.id if result.new and effect_id is None else
             f"Recorded {what} {result.id}: {result.state} (seq {result.seq})")


@cli.command()
@click.argument("rev")
@click.option("--since", metavar="REV", help="Only effects with a record after REV's history.")
@click.option("--state", "states", metavar="S,...", help="Only effects whose latest state is one of these.")
@click.option("-n", "--limit", type=click.IntRange(min=1), help="At most N effects (a page).")
@click.option("--cursor", type=click.IntRange(min=0), metavar="SEQ", help="Resume after a page (its next_cursor).")
@pass_ctx
def effects(ctx, rev, since, states, limit, cursor):
    """External effects in REV's history with their latest states and totals (none is ever undone)."""
    wanted = [s.strip() for s in states.split(",") if s.strip()] if states is not None else None
    if wanted is not None and not wanted:
        raise click.UsageError("--state needs at least one state")
    doc = ctx.store().effects.list(rev, since, wanted, limit, cursor)
    t = doc.totals
    lines = [f"{e.state:<8} {e.rollback:<13} {e.id}  {e.kind} {e.target!r}"
             + (f" via {e.provider}" + (f" {e.operation}" if e.operation else "") if e.provider else "")
             + f" (seq {e.first_seq}" + (f", state at {e.state_seq})" if e.state_seq != e.first_seq else ")")
             for e in doc.effects]

    def counts(table):
        return ", ".join(f"{k or '-'} {v}" for k, v in sorted(table.items())) or "none"
    lines += [f"{t['effects']} effects; by state: {counts(t['by_state'])}; by rollback: {counts(t['by_rollback'])}; "
              f"by provider: {counts(t['by_provider'])}"]
    if doc.has_more:
        lines.append(f"more: --cursor {doc.next_cursor}")
    lines.append(f"note: {doc.note}")
    ctx.emit(doc, "\n".join(lines))


@cli.group(invoke_without_command=True)
@click.pass_context
def rollout(click_ctx):
    """Append to and read a thread's JSONL history."""
    _without_subcommand(click_ctx)


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
    result = ctx.store().history.append(thread, data)
    span = (f" (seq {result.first_seq}..{result.history.seq - 1})"
            if result.appended else "")
    ctx.emit(result, f"Appended {result.appended} records to {thread}{span}")


@rollout.command("cat")
@click.argument("thread")
@click.option("--from", "start", type=int, default=0, metavar="SEQ")
@click.option("--to", "stop", type=int, default=None, metavar="SEQ")
@pass_ctx
def rollout_cat(ctx, thread, start, stop):
    """Print records FROM <= seq < TO of THREAD's history (or a checkpoint's), exactly as appended."""
    pieces = ctx.store().history.read(thread, start, stop, whole_records=ctx.as_json, clamp=False)
    if ctx.as_json:
        from agentcas.harnesses.records import parse_line  # ingested logs keep damaged lines: null here
        records = [parse_line(line) for piece in pieces for line in piece.splitlines()]
        ctx.emit({"thread": thread, "from": start, "records": records})
        return
    out = sys.stdout.buffer
    out.flush()
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (an embedding's stdout)
        fd = None
    for piece in pieces:  # verified chunks, written as they are (os.write: no copy into a buffer)
        if fd is None:
            out.write(piece)
            continue
        view = memoryview(piece)
        while view:
            view = view[os.write(fd, view):]
    out.flush()


# --- harness sessions ---------------------------------------------------------------------------
@cli.command()
@click.argument("harness", type=click.Choice(["codex", "claude"]))
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--thread", metavar="NAME", help="Thread name for the session (one file only).")
@click.option("--watch", is_flag=True, help="Follow the paths until SIGINT/SIGTERM (exit 0, all committed).")
@pass_ctx
def ingest(ctx, harness, paths, thread, watch):
    """Ingest Codex or Claude Code session files (or directories) byte for byte, a checkpoint per turn."""
    from agentcas.harnesses import ingest as ingest_module
    stopped: list = []
    if watch:   # before the store opens: a SIGTERM at once still ends the watch cleanly
        import signal
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, lambda *_: stopped.append(True))
    run = ingest_module.Ingest(ctx.store(), harness, paths, thread)
    refusals_shown: set = set()

    def show(reports):
        for r in reports:
            if r.status == "refused":   # on stderr, with --json too: the document has it as well
                if (r.path, r.error) not in refusals_shown:   # --watch: once, not every pass
                    click.echo(f"agentcas: error: refused: {_one_line(r.error)}", err=True)
                    refusals_shown.add((r.path, r.error))
            elif ctx.as_json:
                continue
            elif r.status == "ingested":
                click.echo(escape_controls(f"{r.thread}: +{r.appended} records (seq {r.first_seq}..{r.seq}), "
                           f"{len(r.checkpoints)} checkpoints"
                           + (f", damaged lines {', '.join(map(str, r.skipped_lines[:20]))} kept and skipped "
                              "by replay" if r.skipped_lines else "")
                           + (f", {r.partial_bytes} bytes of a partial line wait" if r.partial_bytes else "")
                           + f"  [{r.path}]"))
            elif not watch:
                partial = f" ({r.partial_bytes} bytes of a partial line)" if r.partial_bytes else ""
                click.echo(escape_controls(f"{r.thread or '-'}: {r.status}" + partial
                                           + f"  [{r.path}]"))

    if watch:
        totals = {"passes": 0, "appended": 0, "checkpoints": 0}

        def on_run(reports):
            totals["passes"] += 1
            totals["appended"] += sum(r.appended for r in reports)
            totals["checkpoints"] += sum(len(r.checkpoints) for r in reports)
            show(reports)

        reports = ingest_module.watch(run, lambda: bool(stopped), on_run)
        doc = dict(ingest_module.summary(reports), watch=totals)
        ctx.emit(doc, f"stopped after {totals['passes']} passes: {totals['appended']} records, "
                      f"{totals['checkpoints']} checkpoints ingested")
        return
    reports = run.run()
    show(reports)
    doc = ingest_module.summary(reports)
    ctx.emit(doc)
    if doc["refused"]:
        raise ingest_module.SessionRefused(f"{len(doc['refused'])} file(s) refused: "
                                           + ", ".join(doc["refused"][:5]))


@cli.command()
@click.argument("rev")
@click.option("--at", "at", type=click.IntRange(min=0), metavar="SEQ", help="Replay the first SEQ records.")
@click.option("--format", "fmt", type=click.Choice(["codex", "claude"]), help="The log format (default: detected).")
@pass_ctx
def replay(ctx, rev, at, fmt):
    """What the model saw at record SEQ of REV, rebuilt by the harness's own resume rules (never executes)."""
    from agentcas.harnesses import replay as replay_module
    doc, records = replay_module.replay_records(ctx.store(), rev, at, fmt)
    if ctx.as_json:
        # ASCII escapes: a log's text may hold lone surrogates that stdout cannot encode.
        click.echo(json.dumps(doc, indent=2, ensure_ascii=True, sort_keys=True))
    else:
        click.echo(replay_module.render_text(doc, records).encode("utf-8", "replace").decode("utf-8"))


# --- harness hooks, rewind and resume (harnesses/hooks.py, hook_settings.py, rewind.py) -------
class _HookGroup(click.Group):
    """`hook ...`: a usage error exits 1, never 2 (a Claude Code hook exiting 2 blocks the agent)."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _hook_failure(ctx, exc.format_message()) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _hook_failure(ctx, exc.format_message()) from None


def _hook_failure(click_ctx, message: str, store_path: str | None = None):
    """The one-line error a hook ends with (exit 1), also written to the hook log."""
    from agentcas.harnesses import hooks
    obj = click_ctx.find_object(Context)
    if store_path is None:
        workspace = os.environ.get("CLAUDE_PROJECT_DIR") or os.getcwd()
        store_path = hooks.hook_store_path(obj.store_path if obj else None, workspace)
    hooks.write_log(hooks.log_path_for(store_path), f"error: {message}")
    return hooks.HookFailed(message)


def _run_hook(ctx: Context, parse) -> None:
    """Parse the event, checkpoint; any failure is one line, exit 1, a log line. Stdout stays empty."""
    from agentcas.harnesses import hooks
    click_ctx = click.get_current_context()
    store_path = None
    try:
        event = parse()
        if event is None:
            return   # not an event that checkpoints
        store_path = hooks.hook_store_path(ctx.store_path, event.workspace)
        store = hooks.open_hook_store(store_path, ctx.refs)
        log = hooks.log_path_for(store_path)
        outcome = hooks.run_hook(store, event)
        for note in outcome.notes:
            hooks.write_log(log, f"{event.thread}: note: {note}")
        landed = outcome.checkpoint
        refused = None if landed is None else landed.refused
        if refused and landed is not None:
            raise hooks.HookFailed(f"{event.thread}: refused: {refused}; the workspace checkpoint "
                                   f"{landed.checkpoint[:12]} was made without it")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a hook reports every failure the same way
        if isinstance(exc, click.exceptions.Exit) and exc.exit_code == 0:
            raise
        if isinstance(exc, click.ClickException):
            message = exc.format_message()
        elif isinstance(exc, AgentcasError):
            message = str(exc)
        else:
            failure = _system_failure(exc) if isinstance(exc, Exception) else None
            message = str(failure) if failure is not None else \
                f"internal error: {type(exc).__name__}: {exc} (set AGENTCAS_DEBUG=1 for a traceback)"
            if os.environ.get("AGENTCAS_DEBUG") == "1":
                _print_traceback()
        raise _hook_failure(click_ctx, _one_line(message), store_path) from None


@cli.group("hook", cls=_HookGroup)
def hook_group():
    """Checkpoint while Claude Code or Codex works (never exits 2; failures go to hooks.log)."""


@hook_group.command("claude")
@pass_ctx
def hook_claude(ctx):
    """Checkpoint for one Claude Code hook event (JSON on stdin): workspace and transcript."""
    from agentcas.harnesses import hooks
    _run_hook(ctx, lambda: hooks.claude_event(hooks.read_stdin_event(sys.stdin.buffer)))


@hook_group.command("codex")
@click.argument("payload")
@pass_ctx
def hook_codex(ctx, payload):
    """Checkpoint for one Codex notify PAYLOAD (agent-turn-complete): workspace and rollout."""
    from agentcas.harnesses import hooks
    _run_hook(ctx, lambda: hooks.codex_event(payload))


@hook_group.group("install", cls=_HookGroup)
def hook_install():
    """Add the hook to a harness's settings (or take it out with --uninstall)."""


def _install_text(result) -> str:
    verb = ("Installed" if result.installed else "Uninstalled") if result.changed else "Nothing to change in"
    return f"{verb} {result.harness} hook: {result.path}" + (f" ({result.command})" if result.installed else "")


@hook_install.command("claude")
@click.option("--project", type=click.Path(file_okay=False), metavar="DIR",
              help="Install in DIR/.claude/settings.json (default: the user's settings).")
@click.option("--uninstall", is_flag=True, help="Take the hook out instead.")
@pass_ctx
def hook_install_claude(ctx, project, uninstall):
    """Add `agentcas hook claude` to Claude Code's settings (PostToolUse, UserPromptSubmit, Stop)."""
    from agentcas.harnesses.hook_settings import install_claude
    result = install_claude(project, uninstall, ctx.store_path)
    ctx.emit(result.to_json(), _install_text(result))


@hook_install.command("codex")
@click.option("--uninstall", is_flag=True, help="Take the hook out instead.")
@pass_ctx
def hook_install_codex(ctx, uninstall):
    """Set Codex's notify (config.toml) to `agentcas hook codex`."""
    from agentcas.harnesses.hook_settings import install_codex
    result = install_codex(uninstall, ctx.store_path)
    ctx.emit(result.to_json(), _install_text(result))


def _session_store(ctx: Context, directory: str | None):
    """The store a hook would have used for `directory`: --store, $AGENTCAS_STORE, `.agentcas`
    upward, else the per-user store if there is one."""
    if ctx._store is None and not (ctx.store_path or os.environ.get("AGENTCAS_STORE")):
        from agentcas.harnesses import hooks
        from agentcas.repository import find_store
        if not find_store(directory) and not find_store():
            user = hooks.user_store_path()
            if os.path.isfile(os.path.join(user, "data.mdb")):
                ctx.store_path = user
    return ctx.store()


def _session_doc(undo, workspace, placement) -> dict:
    return {"undo": undo, "workspace": workspace,
            "session": None if placement is None else {"id": placement.id, "path": placement.path,
                                                       "resume": placement.resume}}


def _session_text(placement) -> str:
    if placement is None:
        return ""
    where = "written to" if placement.written else "already at"
    return f"session {placement.id} {where} {placement.path}\ncontinue it with: {placement.resume}"


@cli.command("rewind")
@click.argument("thread")
@click.option("--to", "rev", required=True, metavar="REV", help="The checkpoint to go back to.")
@click.option("--only", type=click.Choice(["code", "conversation"]), help="Rewind only the files or only the session.")
@click.option("--workspace", type=click.Path(file_okay=False), metavar="DIR",
              help="The workspace to rewind (default: the one the thread's checkpoints recorded).")
@pass_ctx
def rewind_cmd(ctx, thread, rev, only, workspace):
    """Files and conversation back to REV: the workspace checkpointed first (undo), then made equal
    to REV's files; a forked session the harness resumes."""
    from agentcas.harnesses.rewind import rewind
    result = rewind(_session_store(ctx, workspace), thread, rev, only, workspace)
    doc = dict(_session_doc(result.undo, result.workspace, result.session), target=result.target,
               files_written=list(result.written), files_removed=list(result.removed))
    lines = []
    if result.undo:
        lines.append(f"rewound {result.workspace} to {result.target[:12]}: {len(result.written)} files written, "
                     f"{len(result.removed)} removed; undo with: agentcas rewind {thread} --to {result.undo[:12]} "
                     "--only code")
    if result.session:
        lines.append(_session_text(result.session))
    ctx.emit(doc, "\n".join(lines))


@cli.command("resume")
@click.argument("thread")
@click.option("--at", "at", metavar="REV", help="Up to this checkpoint of THREAD (default: all its records).")
@click.option("--cwd", type=click.Path(file_okay=False), metavar="DIR",
              help="The checkout a Claude Code session belongs to on this machine (default: the one it "
                   "recorded if it exists here, else the current directory).")
@pass_ctx
def resume_cmd(ctx, thread, at, cwd):
    """Write THREAD's stored session where this machine's harness finds it, byte for byte, same id
    (the same file there: exit 0; a different one: exit 3, nothing written)."""
    from agentcas.harnesses.rewind import resume
    placement = resume(_session_store(ctx, cwd), thread, at, cwd)
    ctx.emit(_session_doc(None, os.path.abspath(cwd) if cwd else None, placement), _session_text(placement))


# --- commands of later layers register below ------------------------------------------------

# --- gc and fsck (gc helper) ----------------------------------------------------------------
# (gc helper: commands go here)
@cli.group("gc", invoke_without_command=True)
@click.option("--dry-run", is_flag=True, help="Print the plan; delete nothing.")
@click.option("--grace", default=gc_defaults.DEFAULT_GRACE_TEXT, show_default=True, metavar="DURATION",
              help="Keep objects written less than this ago (0s, 90s, 15m, 1h, 7d).")
@click.option("--expire-reflog", default=gc_defaults.DEFAULT_EXPIRE_REFLOG_TEXT, show_default=True,
              metavar="DURATION|now", help="Expire reflog entries older than this (never a thread's newest).")
@click.option("--report", "report_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the lineage report to FILE (JSON with --json or a .json name, else text).")
@click.option("--wait", default=gc_defaults.DEFAULT_WAIT_TEXT, show_default=True, metavar="DURATION",
              help="How long to wait for writes in progress before stopping incomplete.")
@click.option("--batch", default=gc_defaults.BATCH_DELETES, type=click.IntRange(min=1), hidden=True,
              help="Objects deleted per write transaction.")
@click.pass_context
def gc_command(click_ctx, dry_run, grace, expire_reflog, report_file, wait, batch):
    """Delete objects no thread, kept reflog entry, recent write or write in progress needs."""
    if click_ctx.invoked_subcommand is not None:
        return
    from agentcas.gc import report as gc_report
    from agentcas.gc.plan import parse_duration
    ctx = click_ctx.obj
    grace_s, expire_s = parse_duration(grace), parse_duration(expire_reflog, allow_now=True)
    wait_s = parse_duration(wait)
    store = _open_store_checked(ctx)
    with Progress("gc") as progress:
        done = store.gc.run(grace_s, expire_s, dry_run=dry_run, report=bool(report_file),
                            wait=wait_s, progress=progress, batch=batch)
    doc = {"dry_run": done.dry_run, "plan": done.plan, "result": done.result}
    if report_file:
        as_json = ctx.as_json or report_file.endswith(".json")
        text = (json.dumps(done.report, indent=2, sort_keys=True) + "\n" if as_json
                else gc_report.render_text(done.report) + "\n")
        try:
            with open(report_file, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise AgentcasError(f"cannot write report {report_file}: {exc.strerror}") from None
        doc["report_file"] = os.path.abspath(report_file)
    plan, result = done.plan, done.result
    rec, held, live = plan["reclaimable"], plan["held_by_grace"], plan["live"]
    lines = [f"{plan['objects']} objects: {live['objects']} live ({live['bytes']} bytes), "
             f"{rec['objects']} reclaimable ({rec['bytes']} bytes), {held['objects']} held by grace "
             f"({held['bytes']} bytes)",
             "roots: " + ", ".join(f"{n} {kind}" for kind, n in plan["roots"].items()),
             f"reflog: {plan['reflog']['expiring']} of {plan['reflog']['entries']} entries expire"]
    if dry_run:
        lines.append("dry run: nothing deleted")
    else:
        lines.append(f"deleted {result.deleted_objects} objects ({result.deleted_bytes} bytes), "
                     f"expired {result.reflog_expired} reflog entries")
        if result.repack is not None:
            lines.append(f"repacked {result.repack['packs_rewritten']} packs ({result.repack['objects_moved']} "
                         f"objects moved), {result.repack['bytes_reclaimed']} bytes reclaimed")
        if not result.complete:
            click.echo(f"agentcas: note: gc stopped early: {len(result.blocked_by)} write(s) still in "
                       "progress; run gc again later", err=True)
    lines += [f"note: {note}" for note in plan["notes"]]
    ctx.emit(doc, "\n".join(lines))


@gc_command.command("explain")
@click.argument("object_id", metavar="ID")
@click.option("--grace", default=gc_defaults.DEFAULT_GRACE_TEXT, show_default=True, metavar="DURATION")
@click.option("--expire-reflog", default=gc_defaults.DEFAULT_EXPIRE_REFLOG_TEXT, show_default=True,
              metavar="DURATION|now")
@pass_ctx
def gc_explain(ctx, object_id, grace, expire_reflog):
    """Why object ID is alive (an object id, a file id as show --files prints it, or a unique hex
    prefix of 8+ digits): the path from a root, or unreachable."""
    from agentcas.gc import explain as gc_explain_module
    from agentcas.gc.plan import parse_duration
    doc = ctx.store().gc.explain(object_id, parse_duration(grace),
                                 parse_duration(expire_reflog, allow_now=True))
    ctx.emit(doc, gc_explain_module.render_text(doc.to_json()))


def _open_store_checked(ctx):
    """ctx.store(), but an LMDB file LMDB itself cannot open, or one whose pages are damaged
    (so that the store's own records read as missing), is corruption (exit 4)."""
    from agentcas.cas.lmdb_store import StoreCorrupt, StoreUnavailable, StoreUnreadable
    try:
        return ctx.store()
    except StoreUnreadable as exc:
        raise StoreCorrupt(f"store database is corrupt: {exc}") from None
    except StoreUnavailable:
        path = ctx.store_path or os.environ.get("AGENTCAS_STORE")
        if path and os.path.isfile(os.path.join(path, "data.mdb")):
            from agentcas.gc.fsck import check_pages
            check_pages(os.path.abspath(path))
        raise


@cli.command("fsck")
@pass_ctx
def fsck_command(ctx):
    """Verify every stored object, table row, history position and thread closure (exit 4 if bad)."""
    from agentcas.gc import fsck as gc_fsck
    store = _open_store_checked(ctx)
    with Progress("fsck") as progress:
        doc = store.gc.fsck(progress)
    ctx.emit(doc, gc_fsck.render_text(doc.to_json()))
    if not doc.ok:
        first = doc.problems[0]["message"]
        more = len(doc.problems) - 1
        raise gc_fsck.FsckFailed(f"fsck found {len(doc.problems)} problem(s): {first}"
                                 + (f" (and {more} more)" if more else ""))

# --- keys, trust, signatures, bundles, remotes (exchange helper) ----------------------------
# (exchange helper: commands go here)

# keys, trust, signatures, bundles
@cli.command()
@click.argument("name")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Directory for NAME.key and NAME.pub.")
@pass_ctx
def keygen(ctx, name, out_dir):
    """Create an Ed25519 key pair: NAME.key (mode 0600; $AGENTCAS_KEY_PASSPHRASE encrypts it) and NAME.pub."""
    from agentcas.signing.keys import write_keypair
    result = write_keypair(name, out_dir)
    ctx.emit(result, f"{result['key_id']}\nWrote {result['private_key']} (private, 0600"
                     f"{', encrypted' if result['encrypted'] else ''}) and {result['public_key']}")


@cli.group("trust", invoke_without_command=True)
@click.pass_context
def trust_group(click_ctx):
    """The signers whose signatures this store accepts, per namespace."""
    _without_subcommand(click_ctx, "list")


@trust_group.command("add")
@click.argument("name")
@click.argument("pubkey_file", type=click.Path(dir_okay=False))
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="Namespace the signer is trusted for (repeatable; default agentcas-checkpoint-v1).")
@pass_ctx
def trust_add(ctx, name, pubkey_file, namespaces):
    """Trust the public key in PUBKEY_FILE as signer NAME."""
    entry = ctx.store().trust.add(name, pubkey_file, namespaces)
    ctx.emit(entry, f"Trusted {entry.name} ({entry.public_key.id}) for {', '.join(entry.namespaces)}")


@trust_group.command("list")
@pass_ctx
def trust_list(ctx):
    """List trusted signers."""
    rows = ctx.store().trust.list()
    ctx.emit({"trusted": rows}, "\n".join(f"{r.name:<20} {r.public_key.id}  {','.join(r.namespaces)}"
                                          for r in rows))


@trust_group.command("remove")
@click.argument("name")
@pass_ctx
def trust_remove(ctx, name):
    """Stop trusting signer NAME."""
    removed = ctx.store().trust.remove(name)
    ctx.emit(removed, f"Removed trusted signer {name} ({removed.entry.public_key.id})")


@cli.command()
@click.argument("rev")
@click.option("--key", "key_file", required=True, type=click.Path(dir_okay=False), help="Private key file.")
@pass_ctx
def sign(ctx, rev, key_file):
    """Sign checkpoint REV and store the signature."""
    result = ctx.store().trust.sign(rev, key_file)
    ctx.emit(result, f"Signed {result.checkpoint[:12]} ({result.thread}) with key {result.key_id}")


@cli.command()
@click.argument("target", metavar="REV|BUNDLE")
@pass_ctx
def verify(ctx, target):
    """Exit 0 only if a trusted signature verifies (and, for a bundle, every hash, the closure and length)."""
    store = ctx.store()
    if os.path.isfile(target):
        with Progress("verify") as progress:
            result = store.remotes.verify_bundle(target, progress=progress)
        text = (f"bundle OK: {result.objects} objects, {result.files} files, checkpoint "
                f"{result.checkpoint[:12]} ({result.thread}); {result.reason}")
    else:
        from agentcas.exchange.bundle import NoBundleFile
        from agentcas.refs.revisions import UnknownRevision
        try:
            result = store.trust.verify(target)
        except UnknownRevision:
            if target.endswith(".bundle") or os.sep in target:  # meant as a file, surely
                raise NoBundleFile(f"bundle file {target} does not exist (nor is it a revision)") from None
            raise
        text = f"checkpoint {result.checkpoint[:12]}: {result.reason}"
    ctx.emit(result, text)


@cli.command("export")
@click.argument("rev")
@click.option("-o", "--output", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Bundle file to write (must not exist).")
@click.option("--sign", "key_file", type=click.Path(dir_okay=False), metavar="KEYFILE",
              help="Sign the bundle with this private key.")
@click.option("--allow-secret", "allow_secrets", multiple=True, metavar="GLOB",
              help="Export files matching GLOB even if they look like secrets.")
@click.option("--allow-rollout-secrets", is_flag=True,
              help="Export rollout records even if they look like secrets (never a private key).")
@pass_ctx
def export_cmd(ctx, rev, out_path, key_file, allow_secrets, allow_rollout_secrets):
    """Write checkpoint REV with its files, ancestry and history into one bundle file."""
    with Progress("export") as progress:
        result = ctx.store().remotes.export_bundle(rev, out_path, key_file, allow_secrets, progress=progress,
                                                   allow_rollout_secrets=allow_rollout_secrets)
    signed = f", signed by {', '.join(result.signatures)}" if result.signatures else ", unsigned"
    ctx.emit(result, f"Exported {result.checkpoint[:12]} ({result.thread}) to {result.bundle}: "
                     f"{result.objects} objects, {result.bytes} bytes{signed}")


@cli.command("import")
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(dir_okay=False))
@click.option("--as", "as_thread", metavar="THREAD", help="Thread to land it on (default: the bundle's).")
@click.option("--allow-unsigned", is_flag=True, help="Accept a bundle without a trusted signature.")
@click.option("--allow-rollback", is_flag=True, help="Accept a bundle older than one already imported.")
@pass_ctx
def import_cmd(ctx, bundle_path, as_thread, allow_unsigned, allow_rollback):
    """Verify BUNDLE completely, then import it as a new thread or a fast-forward."""
    with Progress("import") as progress:
        result = ctx.store().remotes.import_bundle(bundle_path, as_thread, allow_unsigned, allow_rollback,
                                                   progress=progress)
    moved = "" if result.moved else " (thread already there)"
    ctx.emit(result, f"Imported {result.checkpoint[:12]} as {result.imported_as}{moved}: "
                     f"{result.new_objects} new objects, {result.new_bytes} bytes; {result.reason}")

@cli.command("scan")
@click.argument("rev")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (as the global --json).")
@pass_ctx
def scan_cmd(ctx, rev, as_json):
    """Report likely secrets in REV's files and rollout history (exit 1 if any)."""
    ctx.as_json = ctx.as_json or as_json
    doc = ctx.store().checkpoints.scan(rev)
    lines = [f"{f['path']}:{f['line']}: looks like a {f['rule']}" for f in doc.files]
    lines += [f"rollout {r['thread']} seq {r['seq']}: looks like a {r['rule']}" for r in doc.history]
    found = len(doc.files) + len(doc.history)
    lines.append(f"scan: {'clean' if not found else f'{found} likely secret(s)'} in "
                 f"{'checkpoint ' + doc.checkpoint[:12] if doc.checkpoint else 'no checkpoint'} "
                 f"and {doc.records} rollout records of {doc.thread}")
    ctx.emit(doc, "\n".join(lines))
    if found:  # with --json the report is the one document, `error` and `exit_code` added
        raise AgentcasError(f"scan found {found} likely secret(s) in {rev} (the secrets are not shown)")


# remotes
@cli.group("remote", invoke_without_command=True)
@click.pass_context
def remote_group(click_ctx):
    """Other agentcas stores to push threads to and pull them from."""
    _without_subcommand(click_ctx, "list")


@remote_group.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--refs", "refs", metavar="DSN",
              help="For an s3:// remote: its refs database, postgresql://USER@HOST:PORT/DB (no password).")
@pass_ctx
def remote_add(ctx, name, url, refs):
    """Record the store at URL (a path, file:// URL or s3://BUCKET/PREFIX) as remote NAME."""
    result = ctx.store().remotes.add(name, url, refs)
    made = f"Created an empty store at {result.url}\n" if result.created else ""
    ctx.emit(result, f"{made}Added remote {result.name} -> {result.url}")


@remote_group.command("list")
@pass_ctx
def remote_list(ctx):
    """List remotes and their URLs."""
    rows = ctx.store().remotes.list()
    ctx.emit({"remotes": rows}, "\n".join(f"{r.name}\t{r.url}" for r in rows))


@remote_group.command("remove")
@click.argument("name")
@pass_ctx
def remote_remove(ctx, name):
    """Forget remote NAME (the remote store itself is untouched)."""
    result = ctx.store().remotes.remove(name)
    ctx.emit(result, f"Removed remote {name}")


def _transfer_text(result) -> str:
    verb = result.direction
    if result.up_to_date:
        return f"{result.thread} is up to date with {result.remote}; nothing to {verb}"
    old = (result.old_checkpoint or "-")[:12] if result.old_seq is not None else "(new thread)"
    new = (result.new_checkpoint or "-")[:12]
    forced = " (forced)" if result.forced else ""
    return (f"{verb.capitalize()}ed {result.thread} {old} -> {new}{forced}, seq {result.new_seq}: "
            f"{result.objects} of {result.objects_total} objects, {result.bytes} bytes")


@cli.command()
@click.argument("remote")
@click.argument("thread")
@click.option("--force", is_flag=True, help="Replace the remote thread even if it is not a fast-forward.")
@click.option("--allow-rollout-secrets", is_flag=True,
              help="Push rollout records even if they look like secrets.")
@click.option("--allow-secret", "allow_secrets", multiple=True, metavar="GLOB",
              help="Push file names matching GLOB (':reason': checkpoint reasons) even if they look like secrets.")
@pass_ctx
def push(ctx, remote, thread, force, allow_rollout_secrets, allow_secrets):
    """Send THREAD to REMOTE: only the objects it lacks, then its ref by compare-and-swap."""
    with Progress("push") as progress:
        result = ctx.store().remotes.push(remote, thread, force, progress=progress,
                                          allow_rollout_secrets=allow_rollout_secrets,
                                          allow_secrets=allow_secrets)
    ctx.emit(result, _transfer_text(result))


@cli.command()
@click.argument("remote")
@click.argument("thread")
@click.option("--force", is_flag=True, help="Replace the local thread even if it is not a fast-forward.")
@pass_ctx
def pull(ctx, remote, thread, force):
    """Fetch THREAD from REMOTE into this store (creating it if absent)."""
    with Progress("pull") as progress:
        result = ctx.store().remotes.pull(remote, thread, force, progress=progress)
    ctx.emit(result, _transfer_text(result))

@cli.command("mcp")
@click.option("--thread", "globs", multiple=True, metavar="GLOB",
              help="Serve only threads matching GLOB (repeatable; default: every thread).")
@click.option("--allow-restore", is_flag=True, help="Let agents run restore_checkpoint and revert_thread.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True,
              help="Most items per page; a larger requested limit is shrunk to this.")
@click.option("--workspace", type=click.Path(file_okay=False, exists=True), default=".",
              help="The directory checkpoints are taken from and restores go into (and below).")
@pass_ctx
def mcp_server(ctx, globs, allow_restore, limit, workspace):
    """Serve the checkpoint tools to an agent over MCP on stdin/stdout."""
    try:
        from agentcas.mcp.server import serve_stdio
    except ImportError as exc:
        raise AgentcasError(f"the MCP server needs the mcp SDK: pip install 'agentcas[mcp]' ({exc})") from None
    from agentcas.mcp.tools import ToolHost
    serve_stdio(ToolHost(ctx.store(), tuple(globs), allow_restore, limit, workspace))


@cli.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (another than loopback lets others on the network try the token).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port to listen on (0: a free one).")
@click.option("--no-browser", is_flag=True, help="Do not open a browser; only print the URL.")
@pass_ctx
def ui_command(ctx, host, port, no_browser):
    """Serve a read-only web view of the store; its URL, with an access token, is the first line printed."""
    try:
        import jinja2  # noqa: F401 - the pages' templates; checked before listening
    except ImportError:
        raise AgentcasError("the web view needs Jinja2: pip install 'agentcas[ui]'") from None
    from agentcas.ui.server import serve

    def announce(url: str) -> None:
        click.echo(url)
        sys.stdout.flush()
        click.echo("agentcas: serving a read-only view; Ctrl-C (SIGINT) or SIGTERM stops it", err=True)

    serve(ctx.store(), host, port, not no_browser, announce)


# --- drill (exchange helper) -----------------------------------------------------------------
# (drill: commands go here)
@cli.command()
@click.option("--checkpoint", "rev", metavar="REV",
              help="Drill on this checkpoint of the store instead of a synthetic agent.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory for inspection.")
@pass_ctx
def drill(ctx, rev, keep):
    """End-to-end recovery drill in a temporary place; exit 0 only if every stage holds."""
    from agentcas.drill import run_checkpoint_drill, run_drill
    echo = (lambda line: click.echo(line, err=True)) if ctx.as_json else click.echo
    if rev is None:
        report = run_drill(echo, keep)
    else:
        report = run_checkpoint_drill(ctx.store(), rev, echo, keep)
    if ctx.as_json:
        ctx.emit(report.to_json())


def _without_subcommand(click_ctx, listing: str | None = None) -> None:
    """A group named alone, like `git remote`: runs its `listing` command, or (a group
    with nothing to list) prints its commands; exit 0 either way, not a usage error."""
    if click_ctx.invoked_subcommand is not None:
        return
    group = click_ctx.command
    if listing is not None:
        click_ctx.invoke(group.commands[listing])
        return
    ctx = click_ctx.find_object(Context)
    commands = {name: group.commands[name].get_short_help_str(limit=120) for name in sorted(group.commands)}
    ctx.emit({"commands": commands}, click_ctx.get_help())


def _set_json(click_ctx, _param, value) -> None:
    if value:
        click_ctx.find_object(Context).as_json = True


def _accept_json_after_the_command(group: click.Group) -> None:
    """Every command takes `--json` after its name as well as before it.

    Users write `agentcas replay REV --json` and `agentcas effects REV --json`; the
    option is the global one: it sets the Context's `as_json` when the subcommand's
    arguments are parsed (the group's callback, which makes the Context, has run by then).
    A command with its own `--json` (scan) keeps it.
    """
    for command in group.commands.values():
        if not any("--json" in getattr(p, "opts", ()) for p in command.params):
            command.params.append(click.Option(["--json"], is_flag=True, expose_value=False,
                                               callback=_set_json,
                                               help="Print one JSON document (as the global --json)."))
        if isinstance(command, click.Group):
            _accept_json_after_the_command(command)


_accept_json_after_the_command(cli)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    # --json may come before or after the command; a usage error can stop click before
    # any callback has seen it, so the words given decide too (those before a `--`).
    words = args[:args.index("--")] if "--" in args else args
    context = Context(None, "--json" in words)
    code, message = _run(args, context)
    if message is not None:
        click.echo(f"agentcas: error: {message}", err=True)
    document = context.document
    if context.as_json and message is not None:
        failure = {"error": message, "exit_code": code}
        document = dict(document, **failure) if isinstance(document, dict) else failure
    if context.as_json and document is not None:
        try:
            click.echo(json.dumps(document, indent=2, ensure_ascii=False, sort_keys=True))
        except BrokenPipeError:
            pass
    return code


def _run(args: list, context: Context) -> tuple[int, str | None]:
    """(exit code, the one-line error or None) of running the command `args`."""
    debug = os.environ.get("AGENTCAS_DEBUG") == "1"
    try:
        cli.main(args=args, prog_name="agentcas", standalone_mode=False, obj=context)
        return 0, None
    except click.exceptions.Exit as exc:
        return exc.exit_code, None
    except click.exceptions.Abort:
        return 1, "aborted"
    except click.ClickException as exc:
        if debug:
            _print_traceback()
        return exc.exit_code, _one_line(exc.format_message())
    except AgentcasError as exc:
        if debug:
            _print_traceback()
        return exc.exit_code, _one_line(str(exc))
    except BrokenPipeError:
        return 0, None
    except KeyboardInterrupt:
        return 130, "interrupted"
    except Exception as exc:  # noqa: BLE001 - last resort: still one line
        if debug:
            _print_traceback()
        failure = _system_failure(exc)
        if failure is not None:
            return failure.exit_code, _one_line(str(failure))
        return 1, (f"internal error: {type(exc).__name__}: {_one_line(str(exc))} "
                   "(set AGENTCAS_DEBUG=1 for a traceback)")


def _system_failure(exc: Exception):
    """An OS or LMDB error no layer translated, as the clear SystemFailure it stands for."""
    if isinstance(exc, OSError):
        from agentcas.cas.system_errors import from_os_error
        return from_os_error(exc)
    if type(exc).__module__.startswith("lmdb"):
        from agentcas.cas.lmdb_store import CORRUPTION, corrupt_store, lmdb_errno
        from agentcas.cas.system_errors import from_errno
        if isinstance(exc, CORRUPTION):
            return corrupt_store(exc)
        code = lmdb_errno(exc)
        return None if code is None else from_errno(code, "in the store", detail=str(exc))
    return None


def _print_traceback() -> None:
    import traceback  # lazy: only AGENTCAS_DEBUG=1 needs it (with textwrap, ~1.5 ms)
    traceback.print_exc()


def _one_line(text: str) -> str:
    """`text` as one line, safe on a terminal (a message may quote a name or a log)."""
    return escape_controls(" ".join(text.split()))


def entry_point():
    sys.exit(main())
