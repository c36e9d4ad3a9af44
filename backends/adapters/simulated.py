"""A server that lives in the worker's memory, for demos and benchmarks (never for tests of a
real adapter). Each deployment's `load_options` set `load_seconds`, `tokens_per_second` and,
to rehearse failures, `fail_load`."""

import asyncio
import base64
import hashlib
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .. import messages_api
from . import via_chat
from .base import (
    Adapter,
    AdapterError,
    ErrorCode,
    InferenceCall,
    LoadTarget,
    ProgressCallback,
    ServerModel,
)

# Tokens as a model streams them, each with the space before it: joined they read as text.
UNCAPPED_TOKENS = 16  # an answer's length where the caller sets no cap
REPLY_WORDS = ["This", " answer", " comes", " from", " a", " simulated", " server", ". "]


def answer_id(kind: str) -> str:
    """Unique per answer, shaped as OpenAI's (`chatcmpl-…`, `cmpl-…`): apps key logs on it."""
    return f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-sim{uuid.uuid4().hex[:20]}"


class SimulatedServer:
    """What one simulated server holds; shared by every adapter of the same name."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.options: dict[str, dict[str, Any]] = {}


_SERVERS: dict[str, SimulatedServer] = {}


def simulated_server(name: str) -> SimulatedServer:
    """The in-memory state of the simulated server called `name`."""
    return _SERVERS.setdefault(name, SimulatedServer())


class SimulatedAdapter(Adapter):
    stops_loads = True  # its load runs in the worker's task: cancelling that task stops it

    def __init__(self, name: str, speed: float = 1.0) -> None:
        self.server = simulated_server(name)
        self.speed = speed  # > 1 runs faster than the configured seconds, for benchmarks

    async def list_models(self) -> list[ServerModel]:
        return [ServerModel(id=m, state="loaded") for m in sorted(self.server.loaded)]

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        options = target.options
        seconds = float(options.get("load_seconds", 2.0)) / self.speed
        if options.get("fail_load"):
            raise AdapterError(ErrorCode.LOAD_FAILED, "simulated load failure")
        steps = max(int(seconds * 4), 1)
        for step in range(steps):
            await asyncio.sleep(seconds / steps)
            progress((step + 1) / steps)
        self.server.loaded.add(target.server_model_id)
        self.server.options[target.server_model_id] = options

    async def unload(self, server_model_id: str) -> None:
        self.server.loaded.discard(server_model_id)

    def _check_loaded(self, call: InferenceCall) -> dict[str, Any]:
        if call.server_model_id not in self.server.loaded:
            raise AdapterError(ErrorCode.NOT_LOADED, f"{call.server_model_id} is not loaded")
        return self.server.options.get(call.server_model_id, {})

    def _cap(self, call: InferenceCall) -> int | None:
        cap = call.payload.get("max_tokens") or call.payload.get("max_completion_tokens")
        return int(cap) if cap else None

    def _choices(self, call: InferenceCall) -> int:
        n = call.payload.get("n")
        return n if isinstance(n, int) and 1 <= n <= 8 else 1

    def _finish(self, call: InferenceCall) -> str:
        """Every answer runs to its cap where the caller set one, so it ends as a real
        model's cut short does ("length"); uncapped, it ends by itself."""
        return "length" if self._cap(call) else "stop"

    async def run(self, call: InferenceCall) -> dict[str, Any]:
        if call.kind in via_chat.APIS:
            return await via_chat.run(self, call)
        options = self._check_loaded(call)
        if call.kind == "embedding":
            return embed(call.server_model_id, call.payload)
        if call.kind == "rerank":
            return rerank(call.server_model_id, call.payload)
        if call.kind == "count_tokens":
            return {"input_tokens": messages_api.word_count(call.payload)}
        words = [w async for w in self._words(call, options)]
        text = "".join(words).rstrip()
        choices = range(self._choices(call))  # `n`: each choice the same answer
        usage = usage_of(call, len(words) * len(choices))
        finish = self._finish(call)
        if call.kind == "completion":
            return {
                "id": answer_id(call.kind),
                "object": "text_completion",
                "created": int(time.time()),
                "model": call.server_model_id,
                "choices": [{"index": i, "text": text, "finish_reason": finish} for i in choices],
                "usage": usage,
            }
        message = {"role": "assistant", "content": text}
        return {
            "id": answer_id(call.kind),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": call.server_model_id,
            "choices": [{"index": i, "message": message, "finish_reason": finish} for i in choices],
            "usage": usage,
        }

    async def _words(self, call: InferenceCall, options: dict[str, Any]) -> AsyncIterator[str]:
        per_token_s = 1.0 / (float(options.get("tokens_per_second", 50.0)) * self.speed)
        clock = asyncio.get_running_loop().time
        started = clock()
        for i in range(self._cap(call) or UNCAPPED_TOKENS):
            # Each token is due at its time from the start: a late wake-up (a busy loop)
            # does not push back every token after it.
            await asyncio.sleep(max(started + (i + 1) * per_token_s - clock(), 0.0))
            yield REPLY_WORDS[i % len(REPLY_WORDS)]

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        if call.kind in via_chat.APIS:
            async for event in via_chat.stream(self, call):
                yield event
            return
        options = self._check_loaded(call)
        one_id = answer_id(call.kind)  # every chunk of a stream carries its answer's id
        head = {
            "id": one_id,
            "object": "chat.completion.chunk" if call.kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": call.server_model_id,
        }
        choices = range(self._choices(call))  # `n`: the choices' chunks take turns
        words = 0
        async for word in self._words(call, options):
            words += 1
            for i in choices:
                yield {**head, "choices": [self._part(call, i, word, None)]}
        for i in choices:
            yield {**head, "choices": [self._part(call, i, "", self._finish(call))]}
        # As a server asked for it (`http.counting_usage`): the relay keeps it from a
        # caller that did not ask.
        yield {**head, "choices": [], "usage": usage_of(call, words * len(choices))}

    def _part(self, call: InferenceCall, index: int, word: str, finish: str | None) -> dict:
        """One choice's piece of a chunk; the last (`finish`) carries no text."""
        if call.kind == "completion":
            return {"index": index, "text": word, "finish_reason": finish}
        return {"index": index, "delta": {"content": word} if word else {}, "finish_reason": finish}


def usage_of(call: InferenceCall, completion_tokens: int) -> dict[str, int]:
    """Its prompt's words stand for its tokens (a real server counts with the model's
    tokenizer), so a key's usage in a demo grows with what it sends."""
    prompt = call.payload.get("prompt")
    words = messages_api.word_count(call.payload)
    words += sum(
        len(str(p).split()) for p in (prompt if isinstance(prompt, list) else [prompt]) if p
    )
    prompt_tokens = max(words, 1)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


EMBEDDING_DIMENSIONS = 16  # where the caller asks for no `dimensions`


def embed(model: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One vector per input, as OpenAI's `/v1/embeddings` answers: its words hashed into
    buckets and scaled to length 1, so texts sharing words lie close (a demo's search finds
    something) and the same text always gives the same vector."""
    given = payload.get("input")
    # One input or a list of them; a token array counts as one input of its tokens.
    inputs = (
        given
        if isinstance(given, list) and any(isinstance(i, (str, list)) for i in given)
        else [given]
    )
    asked = payload.get("dimensions")
    size = asked if isinstance(asked, int) and 0 < asked <= 4096 else EMBEDDING_DIMENSIONS
    data, tokens = [], 0
    for index, text in enumerate(inputs):
        words = [str(w) for w in text] if isinstance(text, list) else str(text).lower().split()
        tokens += len(words)
        vector = [0.0] * size
        for word in words:
            bucket = hashlib.blake2b(word.encode(), digest_size=4).digest()
            vector[int.from_bytes(bucket) % size] += 1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        unit = [v / norm for v in vector]
        data.append({"object": "embedding", "index": index, "embedding": encoded(unit, payload)})
    return {
        "object": "list",
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def encoded(vector: list[float], payload: dict[str, Any]) -> list[float] | str:
    """As asked: a list of floats, or base64 of little-endian float32s (OpenAI's clients ask
    for that by default)."""
    if payload.get("encoding_format") == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def rerank(model: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Documents scored by the share of the query's words they hold, best first, as
    llama-server answers `/v1/rerank`."""
    query = set(str(payload.get("query", "")).lower().split())
    documents = [str(d) for d in payload.get("documents") or []]
    scores = [len(query & set(d.lower().split())) / max(len(query), 1) for d in documents]
    ranked = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
    top_n = payload.get("top_n") or len(documents)
    tokens = len(query) + sum(len(d.split()) for d in documents)
    return {
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [{"index": i, "relevance_score": scores[i]} for i in ranked[:top_n]],
    }
