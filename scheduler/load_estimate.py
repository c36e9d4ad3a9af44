"""How long a model's first load on a server should take, before one was measured there.

Every load is timed, and a deployment's moving average (`avg_load_s`) is what the policy,
the wait reasons and the ETA expect of its next load. A deployment never loaded has none,
and a flat default (10 s) is wrong by minutes for a 70B model. What else is known:

0. what its operator says it takes (`expected_load_s`);
1. the same model's loads measured on other servers (the mean of their averages): the
   same weights from a similar disk;
2. its size at its server's own speed: the megabytes a second of the loads measured there,
   for those whose size is known (a server that read 20 GB in 40 s reads 9 GB in about 18);
3. its size at the speed of the loads measured on all servers, where its own has none yet:
   a server's disk may be slower or faster, but a 16 GB model is not a 10 s load because
   its server is new.

The first that has something to go on is used; with neither, the caller's default stays."""

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, Protocol, TypeVar


class Loadable(Protocol):
    @property
    def server_id(self) -> int: ...
    @property
    def size_mb(self) -> int | None: ...
    @property
    def avg_load_s(self) -> float | None: ...
    @property
    def expected_load_s(self) -> int | None: ...


T = TypeVar("T", bound=Loadable)


def expected_loads(deployments: list[T], model_of: Callable[[T], Hashable]) -> dict[int, float]:
    """{index in `deployments`: the load time to expect} for each one never measured for
    which there is a basis (0, else 1, else 2, else 3 above)."""
    by_model: dict[Hashable, list[float]] = defaultdict(list)
    read_mb: dict[int, float] = defaultdict(float)
    read_s: dict[int, float] = defaultdict(float)
    for d in deployments:
        if d.avg_load_s is None:
            continue
        by_model[model_of(d)].append(d.avg_load_s)
        if d.size_mb:
            read_mb[d.server_id] += d.size_mb
            read_s[d.server_id] += d.avg_load_s
    found = {}
    for i, d in enumerate(deployments):
        if d.avg_load_s is not None:
            continue
        if d.expected_load_s:
            found[i] = float(d.expected_load_s)
        elif elsewhere := by_model.get(model_of(d)):
            found[i] = sum(elsewhere) / len(elsewhere)
        elif d.size_mb and read_mb.get(d.server_id):
            found[i] = d.size_mb * read_s[d.server_id] / read_mb[d.server_id]
        elif d.size_mb and read_mb:
            found[i] = d.size_mb * sum(read_s.values()) / sum(read_mb.values())
    return found


def model_name(d: Any) -> str:
    """A `DeploymentView`'s model (its name)."""
    return d.model


def with_expected_loads(
    deployments: tuple[T, ...], model_of: Callable[[T], Hashable]
) -> tuple[T, ...]:
    """The views, each never-measured one with `avg_load_s` set to what to expect of its
    first load (where there is a basis): the policy, its reasons and the ETA then expect
    that, not the flat default. Only views change; the stored average stays unset until a
    load there is measured."""
    found = expected_loads(list(deployments), model_of)
    if not found:
        return deployments
    return tuple(
        replace(d, avg_load_s=found[i]) if i in found else d  # type: ignore[type-var]
        for i, d in enumerate(deployments)
    )
