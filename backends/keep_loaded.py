"""Keep-loaded hours: the times of the week a deployment is kept loaded, such as
`mon-fri 08:00-18:00, sat 10:00-14:00`, read in the team's time zone
(`SWITCHYARD_TIME_ZONE`). Pure: the policy asks where `now` falls.

A window is `[DAYS] HH:MM-HH:MM`. DAYS is a day (`mon`), a range (`mon-fri`, `fri-mon`) or
days joined by `+` (`sat+sun`); without it, every day. A window whose end is not after its
start runs past midnight into the next day (`22:00-06:00`); `00:00-00:00` is the whole day.
"""

import functools
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(r"^(?:(?P<days>[a-z+\-]+)\s+)?(?P<start>\d\d:\d\d)-(?P<end>\d\d:\d\d)$")


@dataclass(frozen=True, slots=True)
class Window:
    days: frozenset[int]  # the weekdays it starts on (Monday 0)
    start: time
    length: timedelta


def parse(text: str) -> tuple[Window, ...]:
    """The windows of `text` (empty: none). ValueError says what is wrong and where."""
    return _parse(text.strip().lower())


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> tuple[Window, ...]:
    windows = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        found = _WINDOW.match(part)
        if not found:
            raise ValueError(f"`{part}` is not `[days] HH:MM-HH:MM` (as in mon-fri 08:00-18:00)")
        start, end = _clock(found["start"], part), _clock(found["end"], part)
        minutes = (end - start) % (24 * 60) or 24 * 60
        days = _days(found["days"], part) if found["days"] else frozenset(range(7))
        windows.append(Window(days, time(start // 60, start % 60), timedelta(minutes=minutes)))
    return tuple(windows)


def _clock(text: str, part: str) -> int:
    hours, minutes = int(text[:2]), int(text[3:])
    if hours > 23 or minutes > 59:
        raise ValueError(f"`{text}` in `{part}` is not a time of day (00:00 to 23:59)")
    return hours * 60 + minutes


def _days(text: str, part: str) -> frozenset[int]:
    found: set[int] = set()
    for piece in text.split("+"):
        first, _, last = piece.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            named = ", ".join(DAYS)
            raise ValueError(f"`{piece}` in `{part}` is not a day or a range of days ({named})")
        a, b = DAYS.index(first), DAYS.index(last or first)
        found.update(d % 7 for d in range(a, b + 1 if b >= a else b + 8))
    return frozenset(found)


def where(text: str, now: datetime, zone: str) -> tuple[bool, datetime | None]:
    """Whether `now` is within the windows of `text`, and when that next changes (the end
    of the window it is in, or the start of the next one); (False, None) without windows."""
    windows = parse(text)
    if not windows:
        return False, None
    tz = ZoneInfo(zone)
    today = now.astimezone(tz).date()
    ends, starts = [], []
    for window in windows:
        for offset in range(-1, 8):  # a window begun yesterday, to one a week on
            day = today + timedelta(days=offset)
            if day.weekday() not in window.days:
                continue
            start = _at(day, window.start, tz)
            end = start + window.length
            if start <= now < end:
                ends.append(end)
            elif start > now:
                starts.append(start)
    if ends:
        return True, min(ends)
    return False, min(starts)


def _at(day: date, clock: time, tz: ZoneInfo) -> datetime:
    """The moment a local clock shows `clock` on `day` (a time skipped by a DST change
    counts as the one an hour on)."""
    return datetime.combine(day, clock, tzinfo=tz)
