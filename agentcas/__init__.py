"""agentcas: a content-addressed store with Git-like lineage for AI-agent state."""

from typing import TYPE_CHECKING, Any

from agentcas.errors import AgentcasError

if TYPE_CHECKING:  # for type checkers; at run time `Store` is loaded on first use (below)
    from agentcas.repository import Store

__version__ = "0.1.0"
__all__ = ["Store", "AgentcasError", "__version__"]


def __getattr__(name: str) -> Any:
    # `Store` is imported on first use, so that `import agentcas.cli` (for --help, --version
    # or a usage error) does not load the whole store (~50 ms of imports).
    if name == "Store":
        from agentcas.repository import Store
        return Store
    raise AttributeError(f"module 'agentcas' has no attribute {name!r}")
