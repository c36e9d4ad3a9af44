"""Fair share between API keys, and each key's processing quota: pure rules of the policy.

Within a class (after aging), keys with requests waiting share the slots by weight: a key's
i-th waiting request (its own rank order, from 0) is tagged (processing + i + 1) / weight,
where `processing` is how many of its requests hold a slot now, and the class is served in
tag order. Ties go to the key with fewer requests waiting in the class, then to the line's
own order: a plan for the slots that free next (SendNext) is made before anyone knows whose
slot frees first, and a light caller whose own request is about to end must not lose that
slot to a flood that holds as many (it would then wait a whole inference more).

This is weighted fair queuing on slots held, which over time is processing time: a key with
weight 2 holds twice the slots of a key with weight 1 while both have work waiting, and a
caller who floods the line with a thousand requests does not put another caller's one
request behind them all. Requests with no key
(SWITCHYARD_AUTH=off) count as one caller; with one caller the order is the line's own.

A key's `max_processing` is a quota, not a refusal: its requests past it wait until one of
its own ends, while other keys' requests use the free slots."""

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from .snapshot import KeyView, RequestView

NO_KEY = KeyView(id=0)


def fair_order(
    ranked: Iterable[RequestView],
    effective: Callable[[RequestView], int],
    keys: Mapping[int, KeyView],
) -> list[RequestView]:
    """`ranked` (best first) reordered so that within each class the keys share by weight."""
    leveled = [(effective(r), r) for r in ranked]
    waiting = Counter((level, r.api_key) for level, r in leveled)
    nth: Counter[tuple[int, int | None]] = Counter()
    tagged = []
    for position, (level, r) in enumerate(leveled):
        key = keys.get(r.api_key, NO_KEY) if r.api_key is not None else NO_KEY
        i = nth[level, r.api_key]
        nth[level, r.api_key] += 1
        tag = (key.processing + i + 1) / max(key.weight, 1)
        tagged.append((level, tag, waiting[level, r.api_key], position, r))
    tagged.sort(key=lambda t: t[:4])
    return [t[4] for t in tagged]


class Quota:
    """Slots each key may still take in this pass (`max_processing` less what it holds)."""

    def __init__(self, keys: Mapping[int, KeyView]) -> None:
        self.left = {
            k.id: k.max_processing - k.processing
            for k in keys.values()
            if k.max_processing is not None
        }

    def allows(self, r: RequestView) -> bool:
        return r.api_key not in self.left or self.left[r.api_key] > 0

    def take(self, r: RequestView) -> None:
        if r.api_key in self.left:
            self.left[r.api_key] -= 1

    def copy(self) -> "Quota":
        twin = Quota({})
        twin.left = dict(self.left)
        return twin
