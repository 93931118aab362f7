"""The MCP tool server (`agentcas mcp`): agents checkpoint, inspect, diff and fork their own state.

tools.py holds the tools (schemas, scope, bounds, cursors) over the public Store API;
server.py serves them over stdio with the `mcp` SDK (extra `agentcas[mcp]`).
"""
