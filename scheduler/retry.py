"""Exponential backoff shared by load and request retries."""


def backoff_s(attempt: int, base_s: float, ceiling_s: float) -> float:
    """Seconds to wait before retry number `attempt` (1-based): base, 2·base, 4·base… capped."""
    return min(base_s * 2 ** max(attempt - 1, 0), ceiling_s)
