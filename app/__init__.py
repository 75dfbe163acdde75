"""compactd: conversation history and context windows for LLM agents, as a sidecar service."""

__version__ = "0.1.0"
