"""The LangGraph checkpointer on agentcas (extra `agentcas[langgraph]`): see saver.py."""

from agentcas.langgraph.saver import AgentcasSaver, AsyncAgentcasSaver, CorruptCheckpoint, thread_name

__all__ = ["AgentcasSaver", "AsyncAgentcasSaver", "CorruptCheckpoint", "thread_name"]
