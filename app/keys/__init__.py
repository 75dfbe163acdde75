"""API keys: each acts for one tenant; the secret is stored only as a hash."""
