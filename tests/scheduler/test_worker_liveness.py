"""What counts as a live worker, the one rule the dashboard's banner, /readyz, the metrics
and the admin's filter read: a heartbeat fresher than `SWITCHYARD_WORKER_STALE_S`."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import Worker

pytestmark = pytest.mark.django_db


def test_a_worker_is_live_while_its_heartbeat_is_fresher_than_the_stale_time(settings):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "WORKER_STALE_S": 30}
    now = timezone.now()
    ages = {"fresh": 0, "edge": 30, "stale": 31}
    for host, age in ages.items():
        Worker.objects.create(host=host, pid=1, last_heartbeat=now - timedelta(seconds=age))

    live = {w.host for w in Worker.objects.live(now)}
    assert live == {"fresh", "edge"}
    assert {w.host for w in Worker.objects.all() if w.is_live(now)} == live

    settings.SWITCHYARD = {**settings.SWITCHYARD, "WORKER_STALE_S": 5}
    assert {w.host for w in Worker.objects.live(now)} == {"fresh"}
