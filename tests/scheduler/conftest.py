"""Fixtures of the failure tests (`test_request_failures`, `test_load_failures`,
`test_server_failures`); a module with an `upstream` of its own uses its own."""

from collections.abc import Iterator

import pytest

from tests.support.flaky_upstream import FlakyUpstream


@pytest.fixture
def upstream() -> Iterator[FlakyUpstream]:
    """A real OpenAI-compatible HTTP server listing `m1`, told to fail on purpose."""
    with FlakyUpstream(["m1"]) as up:
        yield up


@pytest.fixture
def fast(knobs):
    """Retry and breaker times shrunk a hundredfold."""
    return knobs(RETRY_BASE_S=0.02, RETRY_MAX_S=0.15, BREAKER_COOLDOWN_S=0.6)
