"""The proxy's wire handling: each API's wire format, the agent's history against the stored one, streams, side conversations and recall."""
