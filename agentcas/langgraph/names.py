"""Names: which agentcas thread holds a LangGraph (thread, namespace), and what a saver
checkpoint's reason says.

LangGraph thread T, namespace NS -> agentcas thread `langgraph/<T>` (NS "") or
`langgraph/<T>/ns/<NS>`; a fork keeps the old head as `<thread>/branches/<n>`. T and NS are
percent-encoded outside `[A-Za-z0-9_-]` (so '.', '/', ':' never reach a ref name); an id
longer than 80 encoded bytes becomes `%h` + 40 hex of its BLAKE3 (a real id's '%' is always
encoded, so that form is only a hash). A saver checkpoint's reason is
`langgraph step <step> <source> <checkpoint id>`, with ` + pending writes` on a version that
seals writes into it.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

import blake3

from agentcas.refs.names import encode_component

ROOT = "langgraph"
BRANCHES = "/branches/"
SEALED = " + pending writes"
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_FILE_SAFE = re.compile(r"[a-z0-9_:-]")
_REASON = re.compile(r"^langgraph step (\S+) (\S+) (\S+)( \+ pending writes)?$")
_LONGEST_COMPONENT = 80


def percent_encode(text: str, safe: re.Pattern[str] = _SAFE) -> str:
    """Percent-encode every character outside `safe` (so '.', '/', ':' never reach a ref name)."""
    return encode_component(text, safe)


def component(text: str) -> str:
    """One ref-name component for a LangGraph id; long ids become `%h` + a hash (never a literal)."""
    encoded = percent_encode(text)
    if not encoded or len(encoded) > _LONGEST_COMPONENT:
        return "%h" + blake3.blake3(text.encode("utf-8")).hexdigest()[:40]
    return encoded


def is_hashed(name_component: str) -> bool:
    """Whether a ref-name component is a hash of a long id (its id is read from a record)."""
    return name_component.startswith("%h")


def thread_root(thread_id: str) -> str:
    """The agentcas thread of a LangGraph thread's root namespace; its other namespaces sit below."""
    return f"{ROOT}/{component(str(thread_id))}"


def thread_name(thread_id: str, checkpoint_ns: str = "") -> str:
    """The agentcas thread of a LangGraph (thread, namespace)."""
    root = thread_root(thread_id)
    return f"{root}/ns/{component(checkpoint_ns)}" if checkpoint_ns else root


def thread_component(name: str) -> str:
    """The (encoded) LangGraph thread id component of agentcas thread `name`."""
    return name[len(ROOT) + 1:].split("/", 1)[0]


def ns_component(name: str) -> str:
    """The (encoded) namespace component of agentcas thread `name` ("" for the root namespace)."""
    return name[len(ROOT) + 1:].partition("/ns/")[2]


def decode_component(encoded: str) -> str:
    """The LangGraph id a (not hashed) component encodes."""
    return unquote(encoded)


def is_branch_of(ref: str, name: str) -> bool:
    """Whether `ref` is one of thread `name`'s kept branches (`<name>/branches/<n>`)."""
    return ref.startswith(name + BRANCHES) and "/" not in ref[len(name) + len(BRANCHES):]


def value_file(channel: str) -> str:
    """The file name (under `values/` of a checkpoint's tree) of a channel's value."""
    return percent_encode(channel, _FILE_SAFE)


def checkpoint_reason(step: object, source: object, checkpoint_id: str) -> str:
    """The reason of the agentcas checkpoint that stores a LangGraph checkpoint."""
    return f"langgraph step {step} {quote(str(source), safe='')} {quote(checkpoint_id, safe='')}"


def sealed_reason(reason: str) -> str:
    """The reason of a version of a checkpoint that seals pending writes into it."""
    return reason if reason.endswith(SEALED) else reason + SEALED


def parse_reason(reason: str) -> tuple[str, bool] | None:
    """(LangGraph checkpoint id, sealed) of a saver checkpoint's reason; None for another commit."""
    match = _REASON.match(reason)
    if match is None:
        return None
    return unquote(match.group(3)), bool(match.group(4))
