"""This machine's yardstick: how long one round trip to PostgreSQL and to Redis takes
when the other side is asleep, measured beside each overhead run.

A request at c=1 is a chain of round trips between five processes (client, web, database,
worker, upstream) with nothing else to do, and each hop wakes a sleeping process. On a
shared virtual machine that wake-up costs more than the work: an idle round trip to
PostgreSQL takes several times one made back to back (0.23 against 0.05 ms, the day this was
written). It also varies from day to day with the host, so a table from one session is read
beside its own yardstick, not another's."""

import statistics
import time
from collections.abc import Callable

from django.conf import settings

from .stack import BenchDatabase

PAUSE_S = 0.002  # between round trips: long enough for both sides to go to sleep, as at c=1
COUNT = 300


def _p50_ms(call: Callable[[], object], pause_s: float, count: int) -> float:
    call()  # connected and warm
    took = []
    for _ in range(count):
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return round(1000 * statistics.median(took), 3)


def round_trips(db: BenchDatabase, count: int = COUNT) -> dict[str, float]:
    """p50 ms of `SELECT 1` (idle and back to back) and of a Redis PING (idle)."""
    found: dict[str, float] = {}
    if db.postgres:
        import psycopg

        with psycopg.connect(db.url, autocommit=True) as conn:

            def select() -> object:
                return conn.execute("SELECT 1").fetchall()

            found["postgres idle"] = _p50_ms(select, PAUSE_S, count)
            found["postgres back to back"] = _p50_ms(select, 0, count)
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            found["redis idle"] = _p50_ms(client.ping, PAUSE_S, count)
        finally:
            client.close()
    return found


def in_idle_round_trips(latency_ms: float | None, yardstick: dict[str, float]) -> int | None:
    """`latency_ms` counted in idle round trips to PostgreSQL: the machine's own unit, in
    which a c=1 latency measured on a fast day and one on a slow day roughly compare (the
    yardstick is a sample too). None without PostgreSQL's yardstick."""
    idle = yardstick.get("postgres idle")
    if not idle or latency_ms is None:
        return None
    return round(latency_ms / idle)
