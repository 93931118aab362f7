"""agentcas: a content-addressed store with Git-like lineage for AI-agent state."""

__version__ = "0.1.0"

from agentcas.repository import Store  # noqa: E402  (after __version__, which it reads)
from agentcas.errors import AgentcasError  # noqa: E402

__all__ = ["Store", "AgentcasError", "__version__"]
