"""Codex rollouts and Claude Code transcripts written from the formats in docs/HARNESSES.md.

Written for tests/test_harness_cli.py from the spec, independently of
tests/support/harness_samples.py, so a disagreement between the
implementation and the spec shows. Each builder returns the 1-based file lines of what it
wrote, so a test can say which lines the model saw.
"""

import json
import uuid


def J(obj):  # one JSONL line
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"

class Codex:
    def __init__(self, thread_id=None, forked_from=None, cwd="/home/u/proj"):
        self.id = thread_id or str(uuid.uuid4())
        self.lines = []
        self.cwd = cwd
        self.t = 0
        meta = {"id": self.id, "timestamp": "2025-10-01T10:00:00.000Z", "cwd": cwd, "originator": "codex_cli_rs",
                "cli_version": "0.50.0", "source": "cli", "model_provider": "openai",
                "base_instructions": {"text": "You are Codex."}, "git": {"commit_hash": "abc", "branch": "main"}}
        if forked_from:
            meta["forked_from_id"] = forked_from
        self.add("session_meta", meta)

    def ts(self):
        self.t += 1
        return f"2025-10-01T10:{self.t // 60:02d}:{self.t % 60:02d}.{self.t % 1000:03d}Z"

    def add(self, kind, payload):
        self.lines.append(J({"timestamp": self.ts(), "type": kind, "payload": payload}))
        return len(self.lines)   # 1-based line

    def ev(self, payload):
        return self.add("event_msg", payload)

    def item(self, payload):
        return self.add("response_item", payload)

    def msg(self, role, text, kind=None):
        kind = kind or ("output_text" if role == "assistant" else "input_text")
        return self.item({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})

    def env(self, date="2025-10-01", cwd=True):
        body = (f"  <cwd>{self.cwd}</cwd>\n" if cwd else "") + f"  <shell>bash</shell>\n  <current_date>{date}</current_date>\n  <timezone>UTC</timezone>\n"
        return self.msg("user", "<environment_context>\n" + body + "</environment_context>")

    def initial_context(self):
        a = self.item({"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "<permissions instructions>\nsandbox workspace-write\n</permissions instructions>"},
            {"type": "input_text", "text": "<collaboration_mode>default</collaboration_mode>"}]})
        b = self.item({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"# AGENTS.md instructions for {self.cwd}\n\n<INSTRUCTIONS>\nbe nice\n</INSTRUCTIONS>"},
            {"type": "input_text", "text": f"<environment_context>\n  <cwd>{self.cwd}</cwd>\n  <shell>bash</shell>\n  <current_date>2025-10-01</current_date>\n  <timezone>UTC</timezone>\n</environment_context>"}]})
        return [a, b]

    def turn_context(self, turn_id, model="gpt-5-codex"):
        return self.add("turn_context", {"turn_id": turn_id, "cwd": self.cwd, "current_date": "2025-10-01", "timezone": "UTC",
                                         "approval_policy": "on-request",
                                         "sandbox_policy": {"type": "workspace-write", "network_access": False,
                                                            "exclude_tmpdir_env_var": False, "exclude_slash_tmp": False},
                                         "model": model, "effort": "medium", "summary": "auto"})

    def turn(self, prompt, turn_id=None, first=False, context=True, end="complete", tool=True, model="gpt-5-codex"):
        """One user turn; returns dict of lines."""
        tid = turn_id or str(uuid.uuid4())
        out = {"turn_id": tid}
        out["started"] = self.ev({"type": "task_started", "turn_id": tid, "model_context_window": 272000,
                                  "collaboration_mode_kind": "default"})
        if first:
            out["context"] = self.initial_context()
        elif context:
            out["context"] = [self.env(cwd=False)]
        out["turn_context"] = self.turn_context(tid, model)
        out["prompt"] = self.msg("user", prompt)
        out["user_message"] = self.ev({"type": "user_message", "message": prompt, "images": [], "local_images": [], "text_elements": []})
        out["items"] = [out["prompt"]]
        self.ev({"type": "agent_reasoning", "text": "**Thinking**"})
        out["items"].append(self.item({"type": "reasoning", "summary": [{"type": "summary_text", "text": "**Thinking**"}],
                                       "content": None, "encrypted_content": "gAAAA"}))
        self.ev({"type": "token_count", "info": None, "rate_limits": None})
        if tool:
            call = "call_" + tid[:8]
            out["items"].append(self.item({"type": "function_call", "name": "shell_command",
                                           "arguments": json.dumps({"command": "rm -rf build", "workdir": self.cwd}),
                                           "call_id": call}))
            if end == "crash":
                out["dangling"] = call
                return out
            out["items"].append(self.item({"type": "function_call_output", "call_id": call,
                                           "output": "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nok\n"}))
        if end == "crash":
            return out
        self.ev({"type": "agent_message", "message": "Done: " + prompt, "phase": "final_answer", "memory_citation": None})
        out["items"].append(self.item({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done: " + prompt}], "phase": "final_answer"}))
        if end == "complete":
            out["end"] = self.ev({"type": "task_complete", "turn_id": tid, "last_agent_message": "Done: " + prompt})
        elif end == "aborted":
            out["end"] = self.ev({"type": "turn_aborted", "turn_id": tid, "reason": "interrupted"})
        return out

    def rollback(self, n):
        return self.ev({"type": "thread_rolled_back", "num_turns": n})

    def manual_compact(self, summary, prompts):
        tid = str(uuid.uuid4())
        self.ev({"type": "task_started", "turn_id": tid, "model_context_window": 272000, "collaboration_mode_kind": "default"})
        from_prefix = "Another language model started to solve this problem and produced a summary of its thinking process."
        hist = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": p}]} for p in prompts]
        hist.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": from_prefix + "\n" + summary}]})
        line = self.add("compacted", {"message": from_prefix + "\n" + summary, "replacement_history": hist})
        self.ev({"type": "context_compacted"})
        self.ev({"type": "task_complete", "turn_id": tid, "last_agent_message": None})
        return line, hist, tid

    def text(self):
        return "".join(self.lines)

    def write(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text())
        return path


class Claude:
    """A Claude Code transcript: one record per content block, parentUuid chain."""

    def __init__(self, session_id=None, cwd="/home/u/proj", version="2.0.20", agent_id=None):
        self.sid = session_id or str(uuid.uuid4())
        self.cwd, self.version, self.agent_id = cwd, version, agent_id
        self.lines, self.last, self.n = [], None, 0
        self.by_line = {}

    def _base(self, kind, parent, sidechain=False, **extra):
        self.n += 1
        rec = {"parentUuid": parent, "isSidechain": sidechain, "userType": "external", "cwd": self.cwd,
               "sessionId": self.sid, "version": self.version, "gitBranch": "main", "type": kind,
               "uuid": str(uuid.uuid4()), "timestamp": f"2025-10-01T10:00:{self.n % 60:02d}.{self.n:03d}Z"}
        if self.agent_id:
            rec["agentId"] = self.agent_id
        rec.update(extra)
        return rec

    def put(self, rec, move=True):
        self.lines.append(J(rec))
        self.by_line[rec.get("uuid")] = len(self.lines)
        if move and rec.get("uuid"):
            self.last = rec["uuid"]
        return rec

    def user(self, content, parent="__last__", sidechain=False, **extra):
        parent = self.last if parent == "__last__" else parent
        return self.put(self._base("user", parent, sidechain, message={"role": "user", "content": content}, **extra))

    def assistant(self, blocks, parent="__last__", sidechain=False, msg_id=None, stop="end_turn"):
        """One record per block, sharing message.id and requestId."""
        parent = self.last if parent == "__last__" else parent
        msg_id = msg_id or "msg_" + uuid.uuid4().hex[:20]
        req = "req_" + uuid.uuid4().hex[:20]
        out = []
        for i, block in enumerate(blocks):
            rec = self._base("assistant", parent, sidechain, requestId=req, message={
                "model": "claude-sonnet-4-5", "id": msg_id, "type": "message", "role": "assistant",
                "content": [block], "stop_reason": stop if i == len(blocks) - 1 else None, "stop_sequence": None,
                "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                          "output_tokens": 5, "service_tier": "standard"}})
            self.put(rec)
            parent = rec["uuid"]
            out.append(rec)
        return out

    def tool_result(self, tool_use_id, text, sidechain=False):
        return self.user([{"type": "tool_result", "tool_use_id": tool_use_id, "content": text}], sidechain=sidechain,
                         toolUseResult={"stdout": text, "stderr": "", "interrupted": False})

    def compact(self, summary, trigger="manual"):
        logical = self.last
        b = self.put(self._base("system", None, subtype="compact_boundary", content="Conversation compacted",
                                isMeta=False, level="info", logicalParentUuid=logical,
                                compactMetadata={"trigger": trigger, "preTokens": 12345}))
        s = self.user("This session is being continued from a previous conversation that ran out of context. " + summary,
                      isCompactSummary=True, isVisibleInTranscriptOnly=True)
        cav = self.user("<local-command-caveat>Caveat: The messages below were generated by the user while running local commands.</local-command-caveat>", isMeta=True)
        cmd = self.user("<command-name>/compact</command-name>\n<command-message>compact</command-message>\n<command-args></command-args>")
        out = self.user("<local-command-stdout>Compacted </local-command-stdout>")
        return b, s, cav, cmd, out

    def summary_line(self, text):
        self.lines.append(J({"type": "summary", "summary": text, "leafUuid": self.last}))

    def snapshot(self, mid):
        self.lines.append(J({"type": "file-history-snapshot", "messageId": mid,
                             "snapshot": {"messageId": mid, "trackedFileBackups": {}, "timestamp": "2025-10-01T10:00:00Z"},
                             "isSnapshotUpdate": False}))

    def text(self):
        return "".join(self.lines)

    def write(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text())
        return path
