"""Durations as people read them: on the pages, in the admin and in a waiting request's
reason (dashboard.js's `secs` writes them the same way)."""


def to_ms(seconds: float | None) -> float | None:
    """Seconds as data gives them (the API, the pages' JSON): to the millisecond, so a
    short run or load is still there to be shown."""
    return None if seconds is None else round(seconds, 3)


def spoken(seconds: float) -> str:
    """`1.5 s`; under a tenth of a second in ms (a tiny model's load is not "0.0 s")."""
    return f"{seconds * 1000:.0f} ms" if 0 < seconds < 0.1 else f"{seconds:.1f} s"
