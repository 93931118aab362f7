"""agentcas: a content-addressed store with Git-like lineage for AI-agent state."""

from agentcas.errors import AgentcasError

__version__ = "0.1.0"
__all__ = ["Store", "AgentcasError", "__version__"]


def __getattr__(name: str):
    # `Store` is imported on first use, so that `import agentcas.cli` (for --help, --version
    # or a usage error) does not load the whole store (~50 ms of imports).
    if name == "Store":
        from agentcas.repository import Store
        return Store
    raise AttributeError(f"module 'agentcas' has no attribute {name!r}")
