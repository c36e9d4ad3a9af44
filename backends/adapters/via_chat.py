"""A Responses API or Anthropic Messages API call asked as a chat completion, for servers
whose own form of it Switchyard does not use (Ollama's would reset the model's keep-alive
and options; the simulated server has none), and the answer turned back."""

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from .. import messages_api, responses_api
from .base import Adapter, AdapterError, ErrorCode, InferenceCall

APIS = {"response": responses_api, "message": messages_api}


def chat_call(call: InferenceCall) -> InferenceCall:
    """The chat completion that asks what `call` asks (with its usage, when streamed)."""
    try:
        body = APIS[call.kind].as_chat(call.payload)
    except ValueError as exc:
        raise AdapterError(ErrorCode.BAD_REQUEST, str(exc)) from None
    if call.stream:
        body["stream_options"] = {"include_usage": True}
    return replace(call, kind="chat", payload=body)


async def run(adapter: Adapter, call: InferenceCall) -> dict[str, Any]:
    return APIS[call.kind].from_chat(await adapter.run(chat_call(call)))


async def stream(adapter: Adapter, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
    chunks = adapter.stream(chat_call(call))
    async for event in APIS[call.kind].events_from_chat(call.server_model_id, chunks):
        yield event
