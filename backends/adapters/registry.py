"""Which adapter speaks to which kind of server."""

import functools
from importlib import import_module

from django.conf import settings

from .base import Adapter

ADAPTERS = {
    "openai": "backends.adapters.openai.OpenAIAdapter",
    "lmstudio": "backends.adapters.lmstudio.LMStudioAdapter",
    "ollama": "backends.adapters.ollama.OllamaAdapter",
    "llamacpp": "backends.adapters.llamacpp.LlamaCppAdapter",
    "llamaswap": "backends.adapters.llamaswap.LlamaSwapAdapter",
    "vllm": "backends.adapters.vllm.VLLMAdapter",
    "lemonade": "backends.adapters.lemonade.LemonadeAdapter",
    "simulated": "backends.adapters.simulated.SimulatedAdapter",
}


@functools.cache
def adapter_class(kind: str) -> type[Adapter]:
    """The adapter class that speaks to servers of `kind`."""
    try:
        dotted = ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"no adapter for server kind {kind!r}") from None
    module, _, name = dotted.rpartition(".")
    return getattr(import_module(module), name)


def kind_can(kind: str, flag: str) -> bool:
    """One of an adapter's flags for servers of `kind` (an unknown kind can do nothing)."""
    try:
        return getattr(adapter_class(kind), flag)
    except ValueError:
        return False


def stops_loads(kind: str) -> bool:
    """Whether servers of `kind` can stop a load under way."""
    return kind_can(kind, "stops_loads")


def takes_load_options(kind: str) -> bool:
    """Whether a load on servers of `kind` applies load options (context size, …)."""
    return kind_can(kind, "takes_load_options")


def settings_of(server) -> tuple:
    """What an adapter is built from: after an edit to any of it, build a new one."""
    return (server.kind, server.name, server.base_url, server.api_key, server.max_llm)


def adapter_for(server) -> Adapter:
    """A new adapter for a `backends.Server` (the runtime keeps one per server)."""
    cls = adapter_class(server.kind)
    if server.kind == "simulated":
        return cls(server.name, speed=settings.SWITCHYARD.get("SIM_SPEED", 1.0))
    knobs = settings.SWITCHYARD
    return cls(
        server.base_url,
        server.api_key,
        connect_timeout_s=knobs["CONNECT_TIMEOUT_S"],
        read_timeout_s=knobs["READ_TIMEOUT_S"],
        **cls.server_options(server),
    )
