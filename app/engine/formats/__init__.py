"""The storage format's neighbours: OpenAI and Anthropic messages to and from the canonical model, opaque parts, and what cannot be stored."""
