"""Events: each session's durable event log, streamed as server-sent events."""
