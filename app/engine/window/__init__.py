"""The model's view: pairing tool calls, pruning, ingest truncation and rendering."""
