"""The LangGraph checkpointer on agentcas (extra `agentcas[langgraph]`): see saver.py."""

from agentcas.langgraph.saver import AgentcasSaver, CorruptCheckpoint, thread_name

__all__ = ["AgentcasSaver", "CorruptCheckpoint", "thread_name"]
