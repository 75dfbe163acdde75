"""The stored history as clients read it back: pages of entries, in a wire format."""
