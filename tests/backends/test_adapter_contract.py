"""Every server kind's adapter keeps the `Adapter` contract: a method the worker calls on any
adapter means the same on each. An adapter that reused a base method's name for a helper of
its own (llama-swap's `running()` once listed its processes) broke each call the worker made
through the base's signature: its loads crashed the moment an eviction asked what ran."""

import inspect

import pytest

from backends.adapters.base import Adapter
from backends.adapters.registry import ADAPTERS, adapter_class

CONTRACT = {
    name: inspect.signature(member)
    for name, member in inspect.getmembers(Adapter, inspect.isfunction)
    if not name.startswith("_")
}


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_an_adapter_takes_what_the_base_is_called_with(kind):
    cls = adapter_class(kind)
    for name, base in CONTRACT.items():
        own = inspect.signature(getattr(cls, name))
        assert list(own.parameters) == list(base.parameters), f"{cls.__name__}.{name}{own}"
        assert inspect.iscoroutinefunction(getattr(cls, name)) == inspect.iscoroutinefunction(
            getattr(Adapter, name)
        ), f"{cls.__name__}.{name}: async in one, not in the other"
