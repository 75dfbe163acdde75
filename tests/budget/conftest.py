"""The budget API's tests (usage reports, overflow errors, pruning) share one app and
run inside one rolled-back connection (tests/rolled_back.py)."""

from tests.rolled_back import app, own_app, shared, shared_test_app  # noqa: F401
