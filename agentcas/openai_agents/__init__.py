"""The OpenAI Agents SDK's session protocol on agentcas (docs/SESSIONS.md)."""

from agentcas.openai_agents.session import AgentcasSession, thread_name

__all__ = ["AgentcasSession", "thread_name"]
