"""Which adapter speaks to which kind of server."""

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
}


def settings_of(server) -> tuple:
    """What an adapter is built from: after an edit to any of it, build a new one."""
    return (server.kind, server.name, server.base_url, server.api_key, server.max_llm)


def adapter_for(server) -> Adapter:
    """A new adapter for a `backends.Server` (the runtime keeps one per server)."""
    if server.kind == "simulated":
        from .simulated import SimulatedAdapter

        return SimulatedAdapter(server.name, speed=settings.SWITCHYARD.get("SIM_SPEED", 1.0))
    try:
        dotted = ADAPTERS[server.kind]
    except KeyError:
        raise ValueError(f"no adapter for server kind {server.kind!r}") from None
    module, _, name = dotted.rpartition(".")
    cls = getattr(import_module(module), name)
    knobs = settings.SWITCHYARD
    return cls(
        server.base_url,
        server.api_key,
        connect_timeout_s=knobs["CONNECT_TIMEOUT_S"],
        read_timeout_s=knobs["READ_TIMEOUT_S"],
        **cls.server_options(server),
    )
