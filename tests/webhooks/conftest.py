"""The webhook receiver's fixtures (tests/webhooks/receiver.py)."""

from tests.webhooks.receiver import inbox, receiver_server  # noqa: F401
