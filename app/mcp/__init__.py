"""The Model Context Protocol server at ``/mcp`` (docs/mcp.md): the recall tools
(app.recall), and a session's compactions as resources, for the agents that add tools
by connecting to MCP servers."""
