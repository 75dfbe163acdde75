"""The storage floor: the session row, the message log, and their SQL."""
