"""The Model Context Protocol server at ``/mcp`` (docs/mcp.md): the recall tools
(app.recall) for agents that add tools by connecting to MCP servers."""
