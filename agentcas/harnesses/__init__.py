"""Real agent log formats (Codex CLI rollouts, Claude Code transcripts): discovery,
ingest into threads, and replay reducers that rebuild what the model saw."""
