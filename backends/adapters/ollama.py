"""Ollama, through its native API.

Ollama loads whatever a request names and unloads a model when its `keep_alive` runs out.
To keep the scheduler in charge, every call (the load and each inference) carries the same
`keep_alive` (default -1: stay until Switchyard unloads) and the same runner options
(`num_ctx`...): a request with different options would make Ollama reload the model.
That is why inference uses `/api/chat`, `/api/generate` and `/api/embed` (the `/v1` routes
have no `keep_alive`), translated to and from the OpenAI shapes here; a Responses API or
Anthropic Messages API call goes through `/api/chat` too (`via_chat`).

Load options: `context_length` (or `num_ctx`), `keep_alive`, and `options` (any Modelfile
parameter, e.g. `{"num_gpu": 99}`).
"""

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

from . import via_chat
from .base import (
    CAPABILITIES,
    AdapterError,
    ErrorCode,
    InferenceCall,
    LoadTarget,
    ProgressCallback,
    ServerModel,
    positive_count,
)
from .http import HttpAdapter, read_to_end
from .http_errors import error_from_event

# OpenAI sampling fields → Ollama runner options.
SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_tokens": "num_predict",
    "max_completion_tokens": "num_predict",
}
UNLOAD_WAIT_S = 60.0


def full_name(name: str) -> str:
    """`llama3.2` ≡ `llama3.2:latest`: Ollama reports names with their tag."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def known_capabilities(said: Any) -> tuple[str, ...] | None:
    """Ollama lists `capabilities` (`completion`, `tools`, `vision`, `thinking`, …) from 0.7;
    an older server says nothing."""
    if not isinstance(said, list):
        return None
    return tuple(name for name in CAPABILITIES if name in said)


def runner_options(load_options: dict[str, Any]) -> dict[str, Any]:
    options = dict(load_options.get("options") or {})
    if "context_length" in load_options:
        options["num_ctx"] = load_options["context_length"]
    if "num_ctx" in load_options:
        options["num_ctx"] = load_options["num_ctx"]
    return options


def keep_alive(load_options: dict[str, Any]) -> Any:
    return load_options.get("keep_alive", -1)


def sampling_options(payload: dict[str, Any]) -> dict[str, Any]:
    options = {ours: payload[theirs] for theirs, ours in SAMPLING.items() if theirs in payload}
    if (stop := payload.get("stop")) is not None:
        options["stop"] = [stop] if isinstance(stop, str) else stop
    return options


def ollama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tool_names: dict[str, str] = {}  # OpenAI tool results name a call id; Ollama, a tool name
    out = []
    for m in messages:
        message: dict[str, Any] = {"role": m["role"], "content": ""}
        content = m.get("content")
        if isinstance(content, list):
            texts, images = [], []
            for part in content:
                if part.get("type") == "text":
                    texts.append(part.get("text", ""))
                elif part.get("type") == "image_url":
                    images.append(image_data(part))
            message["content"] = "\n".join(texts)
            if images:
                message["images"] = images
        elif content:
            message["content"] = content
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                function = call.get("function", {})
                tool_names[call.get("id", "")] = function.get("name", "")
                arguments = function.get("arguments") or "{}"
                if isinstance(arguments, str):
                    arguments = json.loads(arguments)
                calls.append({"function": {"name": function.get("name"), "arguments": arguments}})
            message["tool_calls"] = calls
        if m["role"] == "tool" and m.get("tool_call_id") in tool_names:
            message["tool_name"] = tool_names[m["tool_call_id"]]
        out.append(message)
    return out


def image_data(part: dict[str, Any]) -> str:
    url = (part.get("image_url") or {}).get("url", "")
    if not url.startswith("data:") or "," not in url:
        raise AdapterError(ErrorCode.BAD_REQUEST, "Ollama takes images as base64 data URLs only")
    return url.split(",", 1)[1]


def response_format(payload: dict[str, Any]) -> Any:
    fmt = payload.get("response_format") or {}
    if fmt.get("type") == "json_object":
        return "json"
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema")
    return None


def openai_tool_calls(calls: list[dict[str, Any]], streamed: bool) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(calls):
        function = call.get("function", {})
        item = {
            "id": call.get("id") or f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {
                "name": function.get("name"),
                "arguments": json.dumps(function.get("arguments") or {}),
            },
        }
        out.append({"index": function.get("index", i), **item} if streamed else item)
    return out


def finish_reason(answer: dict[str, Any], saw_tool_calls: bool) -> str:
    if saw_tool_calls:
        return "tool_calls"
    return "length" if answer.get("done_reason") == "length" else "stop"


def usage_of(answer: dict[str, Any]) -> dict[str, int]:
    prompt, completion = answer.get("prompt_eval_count", 0), answer.get("eval_count", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class OllamaAdapter(HttpAdapter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spelled: dict[str, str] = {}  # full name → how deployments spell it

    def spell(self, server_model_ids: Iterable[str]) -> None:
        for server_model_id in server_model_ids:
            self.name(server_model_id)

    def name(self, server_model_id: str) -> str:
        full = full_name(server_model_id)
        self.spelled[full] = server_model_id
        return server_model_id

    async def list_models(self) -> list[ServerModel]:
        tags = await self.json("GET", "/api/tags")
        # A loaded model's `context_length` is the context it runs with (`num_ctx`).
        running = {
            full_name(m["name"]): positive_count(m.get("context_length"))
            for m in (await self.json("GET", "/api/ps"))["models"]
        }
        found = []
        for m in tags.get("models", []):
            full = full_name(m["name"])
            capabilities = m.get("capabilities") or []
            found.append(
                ServerModel(
                    id=self.spelled.get(full, full),
                    state="loaded" if full in running else "unloaded",
                    type="embedding" if "embedding" in capabilities else "llm",
                    size_mb=m["size"] // 2**20 if m.get("size") else None,
                    capabilities=known_capabilities(m.get("capabilities")),
                    context_length=running.get(full),
                )
            )
        return self.with_loading(found)

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        name = self.name(target.server_model_id)
        body: dict[str, Any] = {"model": name, "keep_alive": keep_alive(target.options)}
        if options := runner_options(target.options):
            body["options"] = options
        # A prompt-less generate loads a model; embedding models refuse generate, and an
        # embed call with no input loads them instead.
        path = "/api/embed" if target.model_type == "embedding" else "/api/generate"
        if path == "/api/embed":
            body["input"] = []
        with self.tracking_load(name):
            try:
                await self.json("POST", path, json=body, timeout=target.timeout_s)
            except AdapterError as error:
                if error.code == ErrorCode.SERVER_ERROR:  # Ollama answers 500 to failed loads
                    raise AdapterError(
                        ErrorCode.LOAD_FAILED, error.message, status=error.status
                    ) from error
                raise

    async def unload(self, server_model_id: str) -> None:
        name = self.name(server_model_id)
        await self.json("POST", "/api/generate", json={"model": name, "keep_alive": 0})

        # Ollama answers once the runner is marked to expire; the memory goes after.
        async def gone() -> bool:
            ps = await self.json("GET", "/api/ps")
            return full_name(name) not in {full_name(m["name"]) for m in ps["models"]}

        await self.wait_until(gone, f"{name} to leave /api/ps", UNLOAD_WAIT_S)

    async def health(self) -> None:
        await self.request("GET", "/")

    # -- inference -----------------------------------------------------------------------

    def native_request(self, call: InferenceCall) -> tuple[str, dict[str, Any]]:
        p = call.payload
        body: dict[str, Any] = {
            "model": self.name(call.server_model_id),
            "keep_alive": keep_alive(call.load_options),
        }
        options = runner_options(call.load_options)
        if call.kind == "embedding":
            body["input"] = p.get("input", "")
            if "dimensions" in p:
                body["dimensions"] = p["dimensions"]
            if options:
                body["options"] = options
            return "/api/embed", body
        options.update(sampling_options(p))
        body["stream"] = call.stream
        if options:
            body["options"] = options
        if (fmt := response_format(p)) is not None:
            body["format"] = fmt
        if call.kind == "completion":
            prompt = p.get("prompt", "")
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    raise AdapterError(ErrorCode.BAD_REQUEST, "Ollama takes one prompt per call")
                prompt = prompt[0]
            body["prompt"] = prompt
            if "suffix" in p:
                body["suffix"] = p["suffix"]
            return "/api/generate", body
        if call.kind != "chat":
            raise AdapterError(ErrorCode.BAD_REQUEST, f"Ollama does not take {call.kind} calls")
        body["messages"] = ollama_messages(p.get("messages", []))
        if p.get("tools"):
            body["tools"] = p["tools"]
        if "reasoning_effort" in p:
            body["think"] = p["reasoning_effort"]
        return "/api/chat", body

    async def run(self, call: InferenceCall) -> dict[str, Any]:
        if call.kind in via_chat.APIS:  # Ollama's own would reset keep-alive and options
            return await via_chat.run(self, call)
        path, body = self.native_request(call)
        answer = await self.json("POST", path, json=body)
        model, created = call.server_model_id, int(time.time())
        if call.kind == "embedding":
            prompt = answer.get("prompt_eval_count", 0)
            return {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": vector}
                    for i, vector in enumerate(answer.get("embeddings", []))
                ],
                "model": model,
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
        if call.kind == "completion":
            return {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": answer.get("response", ""),
                        "logprobs": None,
                        "finish_reason": finish_reason(answer, False),
                    }
                ],
                "usage": usage_of(answer),
            }
        said = answer.get("message") or {}
        message: dict[str, Any] = {"role": "assistant", "content": said.get("content", "")}
        if said.get("thinking"):
            message["reasoning"] = said["thinking"]
        if said.get("tool_calls"):
            message["tool_calls"] = openai_tool_calls(said["tool_calls"], streamed=False)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason(answer, bool(said.get("tool_calls"))),
                }
            ],
            "usage": usage_of(answer),
        }

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        if call.kind in via_chat.APIS:
            async for event in via_chat.stream(self, call):
                yield event
            return
        if call.kind == "embedding":
            raise AdapterError(ErrorCode.BAD_REQUEST, "embeddings cannot be streamed")
        path, body = self.native_request(call)
        chat = call.kind == "chat"
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": call.server_model_id,
        }
        first, saw_tool_calls = True, False
        async with self.open_stream("POST", path, json=body) as response:
            lines = response.aiter_lines()
            async for line in lines:
                if not line.strip():
                    continue
                part = json.loads(line)
                if part.get("error"):
                    raise error_from_event(part)  # mid-stream errors come with HTTP 200
                if chat:
                    said = part.get("message") or {}
                    delta: dict[str, Any] = {"role": "assistant"} if first else {}
                    if said.get("content") or first:
                        delta["content"] = said.get("content", "")
                    if said.get("thinking"):
                        delta["reasoning"] = said["thinking"]
                    if said.get("tool_calls"):
                        saw_tool_calls = True
                        delta["tool_calls"] = openai_tool_calls(said["tool_calls"], streamed=True)
                    choice: dict[str, Any] = {"index": 0, "delta": delta}
                else:
                    choice = {"index": 0, "text": part.get("response", "")}
                first = False
                if not part.get("done"):
                    if choice.get("delta") or choice.get("text"):
                        yield {**head, "choices": [{**choice, "finish_reason": None}]}
                    continue
                if choice.get("delta", {}).get("content") or choice.get("text"):
                    yield {**head, "choices": [{**choice, "finish_reason": None}]}
                end = {"delta": {}} if chat else {"text": ""}
                reason = finish_reason(part, saw_tool_calls)
                yield {**head, "choices": [{"index": 0, **end, "finish_reason": reason}]}
                # Always: the stored answer counts its tokens (the relay keeps this chunk
                # from a caller that did not ask for it).
                yield {**head, "choices": [], "usage": usage_of(part)}
                await read_to_end(lines)
                return
        raise AdapterError(ErrorCode.CONNECTION, "the stream ended before its last line")
