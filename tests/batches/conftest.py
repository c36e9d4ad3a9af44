"""The access tests' keys, for the batches' tests."""

from tests.access.conftest import make_key  # noqa: F401 (a fixture)
