from agentcas.cli import entry_point

entry_point()
