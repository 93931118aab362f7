"""What each HTML page shows, gathered from the Store API, and its rendering by Jinja2.

Every page is bounded: the lineage is folded (lineage_view.py), a thread page lists at most
MAX_PAGE checkpoints and EFFECTS_PAGE effects, a checkpoint page at most MAX_PAGE files and
MAX_PAGE diff rows, a replay at most REPLAY_LINES lines; each list that goes on says so and
links its next page. Templates autoescape everything; on top of that, every string shown
passes through `terminal_text.escape_controls` (the environment's `finalize`), so control,
bidi and separator characters and lone surrogates from the store are shown as escapes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from agentcas.errors import AgentcasError
from agentcas.terminal_text import escape_controls
from agentcas.ui import documents, lineage_view
from agentcas.ui.documents import MAX_PAGE, PageRequest
from agentcas.ui.reads import StoreReads

THREAD_PAGE = 50
EFFECTS_PAGE = 50
FORKS_SHOWN = 50
REPLAY_LINES = 400
HARNESS_PREFIXES = {"claude/": "claude", "codex/": "codex"}
OPEN_STATES = ["pending", "unknown"]


def thread_url(name: str, **query) -> str:
    return "/thread/" + quote(name, safe="/") + _query(query)


def checkpoint_url(digest: str, **query) -> str:
    return "/checkpoint/" + quote(digest, safe="") + _query(query)


def lineage_url(**query) -> str:
    return "/" + _query(query)


def _query(query: dict) -> str:
    pairs = {k: v for k, v in query.items() if v is not None}
    return "?" + urlencode(pairs) if pairs else ""


def _finalize(value):
    """Every value a template prints: strings with controls and lone surrogates escaped."""
    from markupsafe import Markup
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape_controls(value, lines=True)
    return "" if value is None else value


_environment = None


def environment():
    """The Jinja2 environment (templates beside this module, autoescape on for every template)."""
    global _environment
    if _environment is None:
        import jinja2
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
                                 autoescape=True, finalize=_finalize, undefined=jinja2.StrictUndefined,
                                 trim_blocks=True, lstrip_blocks=True)
        env.globals.update(thread_url=thread_url, checkpoint_url=checkpoint_url, lineage_url=lineage_url,
                           max_page=MAX_PAGE)
        env.filters["short"] = lambda digest: (digest or "-")[:12]
        _environment = env
    return _environment


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


# --- lineage ------------------------------------------------------------------------------------

def lineage_page(reads: StoreReads, root: str | None, after: str | None) -> str:
    lineage = reads.lineage(root)
    total = len(reads.thread_names())
    view = lineage_view.fold(lineage, total, root, after)
    return render("lineage.html", view=view, title="lineage" if root is None else f"lineage of {root}")


# --- thread ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointRow:
    """One line of a thread page: the log entry, its signature status and effect counts."""
    entry: dict
    signature: str
    effects: dict


def thread_page(reads: StoreReads, name: str, cursor: str | None, limit: str | None,
                effects_cursor: str | None) -> str:
    doc = documents.thread_page(reads, name, PageRequest.parse(cursor, limit, THREAD_PAGE))
    state = reads.thread(name)
    rows = [CheckpointRow(e, reads.signature(e["checkpoint"]), reads.effect_counts(e["checkpoint"]))
            for e in doc["checkpoints"]]
    before = PageRequest(effects_cursor, EFFECTS_PAGE).index() if effects_cursor else None
    effects = reads.effects(name, limit=EFFECTS_PAGE, before=before)
    forks = sorted(r["thread"] for r in reads.threads()
                   if r["forked_from"] and r["forked_from"]["thread"] == name and r["thread"] != name)
    return render("thread.html", title=f"thread {name}", name=name, state=state.to_doc(), rows=rows,
                  next_cursor=doc["next_cursor"], first_page=cursor is None, limit=limit, effects=effects,
                  forks=forks[:FORKS_SHOWN], forks_count=len(forks),
                  harness=harness_format(name))


# --- checkpoint -----------------------------------------------------------------------------------

def harness_format(thread: str) -> str | None:
    """codex or claude for a thread the harness ingest names (codex/..., claude/...), else None."""
    for prefix, fmt in HARNESS_PREFIXES.items():
        if thread.startswith(prefix):
            return fmt
    return None


@dataclass(frozen=True)
class Replay:
    """The replay text at a checkpoint's position (its last REPLAY_LINES lines), or why none."""
    lines: list[str]
    omitted: int
    error: str | None


def replay_at(store, digest: str, fmt: str) -> Replay:
    """What the model saw at the checkpoint, as the `replay` command prints it."""
    from agentcas.harnesses import replay as replay_module
    try:
        doc, records = replay_module.replay_records(store, digest, None, fmt)
        text = replay_module.render_text(doc, records)
    except AgentcasError as exc:
        return Replay([], 0, str(exc))
    lines = text.splitlines()
    # The header line says what was replayed; the tail is what the model saw last.
    if len(lines) > REPLAY_LINES:
        return Replay(lines[:1] + lines[-(REPLAY_LINES - 1):], len(lines) - REPLAY_LINES, None)
    return Replay(lines, 0, None)


def checkpoint_page(reads: StoreReads, rev: str, files_cursor: str | None, against: str | None,
                    diff_cursor: str | None) -> str:
    doc = documents.checkpoint_page(reads, rev, PageRequest.parse(files_cursor, None))
    digest = doc["checkpoint"]
    base = against or (doc["parents"][0] if doc["parents"] else None)
    diff, diff_error = None, None
    if base is not None:
        try:
            diff = documents.diff_page(reads, base, digest, PageRequest.parse(diff_cursor, None))
        except documents.BadRequest:
            raise
        except AgentcasError as exc:
            diff_error = str(exc)
    fmt = harness_format(doc["thread"])
    replay = replay_at(reads.store, digest, fmt) if fmt else None
    open_in_history = reads.effects(digest, states=OPEN_STATES, limit=EFFECTS_PAGE)
    open_after = reads.effects_after(digest)
    return render("checkpoint.html", title=f"checkpoint {digest[:12]}", doc=doc, digest=digest,
                  against=against, base=base, diff=diff, diff_error=diff_error,
                  replay=replay, harness=fmt, signature=reads.signature(digest),
                  open_in_history=open_in_history, open_after=open_after)


def error_page(status: int, message: str) -> str:
    return render("error.html", title=f"{status}", status=status, message=message)
