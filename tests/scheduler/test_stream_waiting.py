"""What a streamed request's waiting comment and progress line say: its place, when it is
sent (the worker's last forecast for it, counted down) and why it waits."""

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.models import EtaCheck
from scheduler.api.inference import Waiting, place_and_eta, sent_in
from scheduler.models import State
from tests import factories

pytestmark = pytest.mark.django_db


def forecast_for(r, seconds_ago: float, eta_s: float) -> None:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    EtaCheck.objects.create(
        request_id=r.pk,
        priority=r.priority,
        given_at=at,
        given_s=eta_s,
        position=1,
        last_at=at,
        last_s=eta_s,
        last_position=1,
    )


def test_a_forecast_request_says_when_it_is_sent_counted_down():
    factories.request("m", created_at=timezone.now() - timedelta(seconds=9))
    r = factories.request("m")
    forecast_for(r, seconds_ago=2, eta_s=12)

    position, eta, reported = place_and_eta(r)

    assert position == 2 and reported is None
    assert 9.5 <= eta <= 10.0
    waiting = Waiting(f"position {position}", sent_in(eta), "behind 1 request")
    assert waiting.comment("ready") == (
        ": waiting, ready, position 2, sent in ~10 s: behind 1 request\n\n"
    )
    assert waiting.progress_line() == (
        "Switchyard: waiting, position 2 in line, sent in ~10 s: behind 1 request.\n"
    )


def test_an_eta_past_its_time_says_any_moment_not_a_negative_wait():
    r = factories.request("m")
    forecast_for(r, seconds_ago=30, eta_s=12)
    assert place_and_eta(r) == (1, 0.0, None)
    assert sent_in(0.0) == "sent any moment"


def test_without_a_forecast_or_once_at_the_server_it_says_no_eta():
    r = factories.request("m")
    assert place_and_eta(r) == (1, None, None)
    assert Waiting("position 1", "", "").comment("pending") == ": waiting, pending, position 1\n\n"
    running = factories.request("m", state=State.PROCESSING)
    forecast_for(running, seconds_ago=1, eta_s=5)
    assert place_and_eta(running) == (None, None, None)
    assert Waiting("processing", "", "").progress_line() == ""
    # Not ": waiting, processing, processing".
    assert Waiting("processing", "", "").comment(State.PROCESSING) == ": processing\n\n"
