"""Builders of Codex rollouts and Claude Code transcripts, shaped as docs/HARNESSES.md describes
(read from the harnesses' source; "The two log formats" there). Tests and bench/ build
sessions from these instead of committing large fixture files.
"""

from __future__ import annotations

import json

from agentcas.harnesses.codex_replay import SUMMARY_PREFIX


def dumps(doc) -> bytes:
    """One JSONL line as the harnesses write it (compact JSON, UTF-8, newline)."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def _stamp(n: int) -> str:
    return f"2026-11-30T21:{(n // 60) % 60:02d}:{n % 60:02d}.{n % 1000:03d}Z"


def text_item(role: str, text: str, kind: str | None = None) -> dict:
    kind = kind or ("output_text" if role == "assistant" else "input_text")
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def env_context(cwd: str = "/repo", date: str = "2026-11-30") -> str:
    return (f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n"
            f"  <current_date>{date}</current_date>\n  <timezone>UTC</timezone>\n</environment_context>")


class CodexSession:
    """A Codex rollout under construction: `lines` are the file's lines in order."""

    def __init__(self, thread_id: str = "0199a0b1-0000-7000-8000-000000000001", forked_from: str | None = None,
                 cwd: str = "/repo", meta: bool = True, instructions: str = "You are Codex."):
        self.thread_id = thread_id
        self.cwd = cwd
        self.lines: list[bytes] = []
        self.turns = 0
        self.prompts: list[str] = []
        if meta:
            payload = {"id": thread_id, "timestamp": _stamp(0), "cwd": cwd, "originator": "codex_cli_rs",
                       "cli_version": "0.60.0", "source": "cli", "model_provider": "openai",
                       "base_instructions": {"text": instructions}, "git": {"branch": "main"}}
            if forked_from:
                payload = {"id": thread_id, "forked_from_id": forked_from, **{k: v for k, v in payload.items()
                                                                               if k != "id"}}
            self.record("session_meta", payload)

    # -- raw records -------------------------------------------------------------------------
    def record(self, kind: str, payload) -> int:
        """Append one line; its 1-based line number."""
        self.lines.append(dumps({"timestamp": _stamp(len(self.lines)), "type": kind, "payload": payload}))
        return len(self.lines)

    def item(self, item: dict) -> int:
        return self.record("response_item", item)

    def event(self, kind: str, **fields) -> int:
        return self.record("event_msg", {"type": kind, **fields})

    def raw(self, data: bytes) -> int:
        self.lines.append(data)
        return len(self.lines)

    def copy_lines(self, other: CodexSession, count: int | None = None) -> None:
        """A fork's copy of the source's lines (records as they were, fresh timestamps)."""
        for line in other.lines[:count]:
            doc = json.loads(line)
            doc["timestamp"] = _stamp(len(self.lines))
            self.lines.append(dumps(doc))

    # -- turns -------------------------------------------------------------------------------
    def start(self, turn_id: str | None = None, context: bool = True, model: str = "gpt-5-codex",
              approval: str = "on-request", prompt: str | None = None, initial: bool | None = None) -> str:
        """task_started, the context items, the turn_context and the prompt of a new turn."""
        self.turns += 1
        turn_id = turn_id or f"0199a0b1-{self.turns:04d}-7000-8000-00000000turn"
        self.event("task_started", turn_id=turn_id, model_context_window=272000,
                   collaboration_mode_kind="default")
        if context:
            if initial if initial is not None else self.turns == 1:
                self.item({"type": "message", "role": "developer", "content": [
                    {"type": "input_text", "text": "<permissions instructions>\nsandbox: workspace-write\n"
                                                   "</permissions instructions>"}]})
                self.item(text_item("user", f"# AGENTS.md instructions for {self.cwd}\n\n<INSTRUCTIONS>\n"
                                            "Run the tests.\n</INSTRUCTIONS>"))
            self.item(text_item("user", env_context(self.cwd)))
        self.record("turn_context", {"turn_id": turn_id, "cwd": self.cwd, "approval_policy": approval,
                                     "sandbox_policy": {"type": "workspace-write", "network_access": False},
                                     "model": model, "effort": "medium", "summary": "auto"})
        if prompt is not None:
            self.prompt(prompt)
        return turn_id

    def prompt(self, text: str) -> int:
        self.prompts.append(text)
        line = self.item(text_item("user", text))
        self.event("user_message", message=text, images=[], local_images=[], text_elements=[])
        return line

    def tool_call(self, command: str = "pytest -q", output: str = "Exit code: 0\nWall time: 0.1 seconds\n"
                                                                     "Output:\n3 passed", call_id: str | None = None,
                  answered: bool = True) -> None:
        call_id = call_id or f"call_{len(self.lines)}"
        self.item({"type": "reasoning", "summary": [{"type": "summary_text", "text": "Run the tests"}],
                   "content": None, "encrypted_content": "gAAAA"})
        self.item({"type": "function_call", "name": "shell_command",
                   "arguments": json.dumps({"command": command, "workdir": self.cwd}), "call_id": call_id})
        self.event("token_count", info=None, rate_limits=None)
        if answered:
            self.item({"type": "function_call_output", "call_id": call_id, "output": output})

    def reply(self, text: str) -> None:
        self.event("agent_message", message=text, phase="final_answer")
        self.item({**text_item("assistant", text), "phase": "final_answer"})
        self.event("token_count", info=None, rate_limits=None)

    def complete(self, turn_id: str, last: str | None = None) -> int:
        return self.event("task_complete", turn_id=turn_id, last_agent_message=last)

    def abort(self, turn_id: str, reason: str = "interrupted") -> int:
        return self.event("turn_aborted", turn_id=turn_id, reason=reason)

    def turn(self, prompt: str, reply: str = "Done.", tools: int = 1, **start) -> str:
        """A whole finished turn; its turn id."""
        turn_id = self.start(prompt=prompt, **start)
        for _ in range(tools):
            self.tool_call()
        self.reply(reply)
        self.complete(turn_id, reply)
        return turn_id

    # -- history edits -----------------------------------------------------------------------
    def compact(self, summary: str = "Fixed the login timeout.", history: bool = True, remote: bool = False) -> int:
        """A manual /compact task: its `compacted` line number."""
        self.turns += 1
        turn_id = f"0199a0b1-{self.turns:04d}-7000-8000-0000compact"
        self.event("task_started", turn_id=turn_id, model_context_window=272000,
                   collaboration_mode_kind="default")
        message = "" if remote else f"{SUMMARY_PREFIX}\n{summary}"
        payload: dict = {"message": message}
        if history:
            recent = self.recent_prompts()
            if remote:
                payload["replacement_history"] = [text_item("user", p) for p in recent] + [
                    {"type": "compaction", "encrypted_content": "ENCRYPTED"}]
            else:
                payload["replacement_history"] = [text_item("user", p) for p in recent] + [
                    text_item("user", message)]
        line = self.record("compacted", payload)
        self.event("context_compacted")
        self.complete(turn_id)
        return line

    def recent_prompts(self, budget: int = 80_000) -> list[str]:
        """The newest prompts within ~20k tokens (4 bytes each), as `build_compacted_history` keeps."""
        out, left = [], budget
        for prompt in reversed(self.prompts):
            size = len(prompt.encode())
            if size > left:
                break
            out.append(prompt)
            left -= size
        return list(reversed(out))

    def rollback(self, turns: int = 1) -> int:
        return self.event("thread_rolled_back", num_turns=turns)

    def data(self) -> bytes:
        return b"".join(self.lines)


class ClaudeSession:
    """A Claude Code transcript under construction (one record per content block)."""

    def __init__(self, session_id: str = "5f0c2a7e-1111-4222-8333-444455556666", cwd: str = "/repo",
                 agent_id: str | None = None, version: str = "2.0.14"):
        self.session_id = session_id
        self.cwd = cwd
        self.agent_id = agent_id
        self.version = version
        self.lines: list[bytes] = []
        self.last: str | None = None
        self._n = 0

    def _uuid(self) -> str:
        self._n += 1
        return f"00000000-0000-4000-8000-{self._n:012d}"

    def node(self, kind: str, parent: str | None = "last", **fields) -> str:
        """Append a chain record; its uuid (`parent="last"`: after the previous record)."""
        uid = fields.pop("uuid", None) or self._uuid()
        parent = self.last if parent == "last" else parent
        doc = {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": self.cwd,
               "sessionId": self.session_id, "version": self.version, "gitBranch": "main", "type": kind,
               "uuid": uid, "timestamp": _stamp(len(self.lines))}
        if self.agent_id:
            doc["agentId"] = self.agent_id
        doc.update(fields)
        self.lines.append(dumps(doc))
        if not doc.get("isSidechain"):
            self.last = uid
        return uid

    def prompt(self, text: str, parent: str | None = "last", **fields) -> str:
        return self.node("user", parent, message={"role": "user", "content": text}, **fields)

    def meta(self, text: str, parent: str | None = "last") -> str:
        return self.node("user", parent, message={"role": "user", "content": text}, isMeta=True)

    def assistant(self, *blocks: dict, parent: str | None = "last", message_id: str | None = None,
                  **fields) -> list[str]:
        """One record per content block, sharing message.id and requestId; their uuids."""
        message_id = message_id or f"msg_{len(self.lines):04d}"
        uids = []
        for block in blocks:
            message = {"model": "claude-sonnet-4-5", "id": message_id, "type": "message", "role": "assistant",
                       "content": [block], "stop_reason": None, "stop_sequence": None,
                       "usage": {"input_tokens": 10, "output_tokens": 5}}
            uids.append(self.node("assistant", parent, message=message, requestId=f"req_{message_id}", **fields))
            parent = uids[-1]
        return uids

    def say(self, text: str, **kw) -> list[str]:
        return self.assistant({"type": "text", "text": text}, **kw)

    def tool(self, name: str = "Bash", command: str = "pytest -q", result: str = "3 passed") -> tuple[str, str]:
        tool_id = f"toolu_{len(self.lines):04d}"
        use = self.assistant({"type": "tool_use", "id": tool_id, "name": name, "input": {"command": command}})[0]
        res = self.node("user", "last", message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "content": result, "is_error": False}]},
            toolUseResult={"stdout": result, "stderr": "", "interrupted": False})
        return use, res

    def sidechain(self, task: str, reply: str) -> list[str]:
        """An inline Task subagent (<= v2.0.27): a parentless sidechain prompt and its reply."""
        root = self.node("user", None, message={"role": "user", "content": task}, isSidechain=True)
        answer = self.assistant({"type": "text", "text": reply}, parent=root, isSidechain=True)
        return [root, *answer]

    def compact(self, summary: str = "The user asked to fix the login timeout.", trigger: str = "manual") -> tuple[str, str]:
        """compact_boundary (parentUuid null, logicalParentUuid = last) and the summary record."""
        logical = self.last
        boundary = self.node("system", None, subtype="compact_boundary", content="Conversation compacted",
                             level="info", isMeta=False, logicalParentUuid=logical,
                             compactMetadata={"trigger": trigger, "preTokens": 12345})
        text = ("This session is being continued from a previous conversation that ran out of context. "
                f"The conversation is summarized below:\n{summary}")
        summary_id = self.node("user", boundary, message={"role": "user", "content": text},
                               isCompactSummary=True, isVisibleInTranscriptOnly=True)
        return boundary, summary_id

    def extra(self, doc: dict) -> None:
        """A non-chain line (summary, file-history-snapshot, newer types)."""
        self.lines.append(dumps(doc))

    def data(self) -> bytes:
        return b"".join(self.lines)
