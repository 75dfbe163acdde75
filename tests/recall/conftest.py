"""The app with API keys (tests/ops' fixtures), for the tenant tests."""

from tests.ops.conftest import anon, auth_app  # noqa: F401  (fixtures)
