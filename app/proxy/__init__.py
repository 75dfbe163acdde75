"""The drop-in proxy: OpenAI- and Anthropic-compatible endpoints that store an agent's
history and send its model the managed context (see docs/proxy.md)."""
