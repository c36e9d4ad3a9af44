"""Keep-loaded hours: the format, and where a moment falls in them (pure)."""

from datetime import UTC, datetime

import pytest
from django.core.exceptions import ValidationError

from backends.keep_loaded import parse, where
from backends.models import validate_keep_loaded_hours

THURSDAY_NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def utc(day: int, hour: int, minute: int = 0, month: int = 1) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def test_days_ranges_and_lists():
    [weekdays, weekend, wrapped, daily] = parse(
        "Mon-Fri 08:00-18:00, sat+sun 10:00-14:00, fri-mon 20:00-22:00, 07:00-07:30"
    )
    assert weekdays.days == {0, 1, 2, 3, 4} and weekend.days == {5, 6}
    assert wrapped.days == {4, 5, 6, 0} and daily.days == set(range(7))
    assert parse("") == () and parse("  ") == ()


def test_inside_a_window_until_its_end_outside_until_the_next_start():
    assert where("mon-fri 08:00-18:00", THURSDAY_NOON, "UTC") == (True, utc(1, 18))
    assert where("mon-fri 13:00-18:00", THURSDAY_NOON, "UTC") == (False, utc(1, 13))
    assert where("mon 08:00-09:00", THURSDAY_NOON, "UTC") == (False, utc(5, 8))
    assert where("", THURSDAY_NOON, "UTC") == (False, None)


def test_a_window_past_midnight_began_the_day_before():
    early_thursday = utc(1, 3)
    assert where("wed 22:00-06:00", early_thursday, "UTC") == (True, utc(1, 6))
    assert where("00:00-00:00", early_thursday, "UTC") == (True, utc(2, 0))


def test_the_hours_are_wall_clock_times_in_the_zone_across_a_dst_change():
    """Paris moves to summer time on Sunday 2026-03-29: 08:00-18:00 there is 06:00-16:00
    UTC that day, 07:00-17:00 the day before."""
    assert where("08:00-18:00", utc(29, 6, 30, month=3), "Europe/Paris") == (
        True,
        utc(29, 16, month=3),
    )
    assert where("08:00-18:00", utc(28, 6, 30, month=3), "Europe/Paris") == (
        False,
        utc(28, 7, month=3),
    )


@pytest.mark.parametrize(
    "text, says",
    [
        ("8-18", "is not `[days] HH:MM-HH:MM`"),
        ("mon-fri 08:00", "is not `[days] HH:MM-HH:MM`"),
        ("24:00-08:00", "`24:00` in `24:00-08:00` is not a time of day"),
        ("mon-fry 08:00-18:00", "`mon-fry` in `mon-fry 08:00-18:00` is not a day"),
    ],
)
def test_what_does_not_parse_says_what_and_where(text, says):
    with pytest.raises(ValueError) as error:
        parse(text)
    assert says in str(error.value)
    with pytest.raises(ValidationError):
        validate_keep_loaded_hours(text)
