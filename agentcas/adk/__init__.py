"""Google ADK's session service on agentcas (docs/SESSIONS.md)."""

from agentcas.adk.session_service import AgentcasSessionService, app_thread, session_thread, user_thread

__all__ = ["AgentcasSessionService", "app_thread", "session_thread", "user_thread"]
