"""The simulated server keeps its configured pace and answers in the shapes apps expect."""

import base64
import struct

import pytest

from backends import chat_stream
from backends.adapters import simulated
from backends.adapters.base import InferenceCall


class LateClock:
    """A virtual clock in place of the module's asyncio: every sleep wakes `late_s` after it
    was due."""

    def __init__(self, late_s: float) -> None:
        self.now = 0.0
        self.late_s = late_s

    def get_running_loop(self) -> "LateClock":
        return self

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late_s


async def test_tokens_are_due_at_their_time_from_the_start(monkeypatch):
    clock = LateClock(late_s=0.005)
    monkeypatch.setattr(simulated, "asyncio", clock)
    server = f"sim-{id(clock)}"
    simulated.simulated_server(server).loaded.add("m")
    simulated.simulated_server(server).options["m"] = {"tokens_per_second": 16}
    adapter = simulated.SimulatedAdapter(server)
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

    result = await adapter.run(InferenceCall("chat", "m", payload, False, {}))

    assert result["usage"]["completion_tokens"] == 8
    # 8 tokens at 16 per second: 0.5 s, plus one late wake-up, not eight.
    assert clock.now == pytest.approx(0.5 + 0.005)


def quick(server: str) -> simulated.SimulatedAdapter:
    """A simulated server of its own with `m` loaded, answering at once."""
    simulated.simulated_server(server).loaded.add("m")
    simulated.simulated_server(server).options["m"] = {"tokens_per_second": 10_000}
    return simulated.SimulatedAdapter(server)


def chat(max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


async def test_each_answer_has_an_id_of_its_own_shaped_as_openais():
    """Apps key their logs on an answer's id: two answers never share one, and every chunk
    of a stream carries its answer's."""
    adapter, payload = quick("sim-ids"), chat(2)

    first = await adapter.run(InferenceCall("chat", "m", payload, False, {}))
    second = await adapter.run(InferenceCall("chat", "m", payload, False, {}))
    text = await adapter.run(InferenceCall("completion", "m", {"prompt": "hi"}, False, {}))
    chunks = [c async for c in adapter.stream(InferenceCall("chat", "m", payload, True, {}))]

    assert first["id"].startswith("chatcmpl-") and text["id"].startswith("cmpl-")
    assert len({first["id"], second["id"], text["id"], chunks[0]["id"]}) == 4
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}


async def test_the_answer_reads_as_text_whole_or_streamed():
    """Tokens carry their own spaces, as a model's do: the answer and the stream's joined
    chunks read the same, with no space before the full stop."""
    adapter, payload = quick("sim-text"), chat(10)

    whole = await adapter.run(InferenceCall("chat", "m", payload, False, {}))
    chunks = [c async for c in adapter.stream(InferenceCall("chat", "m", payload, True, {}))]

    text = whole["choices"][0]["message"]["content"]
    assert text == "This answer comes from a simulated server. This answer"
    assert chunks[-1]["choices"] == []  # its usage, as a server asked for it (always)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert streamed.rstrip() == text


async def test_an_answer_cut_at_its_cap_says_so_and_one_without_ends_by_itself():
    """Apps read `finish_reason` to tell a cut answer from a whole one: the simulated model
    runs to the cap it is given ("length", as a real one cut short says) and, with none,
    ends by itself after its usual length ("stop"), whole or streamed."""
    adapter = quick("sim-finish")
    uncapped = {"messages": [{"role": "user", "content": "hi"}]}

    def finish(answer: dict) -> str:
        return answer["choices"][0]["finish_reason"]

    async def streamed_finish(payload: dict) -> str:
        call = InferenceCall("chat", "m", payload, True, {})
        return [finish(c) async for c in adapter.stream(call) if c["choices"]][-1]

    cut = await adapter.run(InferenceCall("chat", "m", chat(3), False, {}))
    whole = await adapter.run(InferenceCall("chat", "m", uncapped, False, {}))
    text = await adapter.run(InferenceCall("completion", "m", {"prompt": "hi"}, False, {}))

    assert (finish(cut), cut["usage"]["completion_tokens"]) == ("length", 3)
    assert (finish(whole), whole["usage"]["completion_tokens"]) == ("stop", 16)
    assert finish(text) == "stop"
    assert await streamed_finish(chat(3)) == "length"
    assert await streamed_finish(uncapped) == "stop"


async def test_embeddings_give_one_vector_per_input_and_near_ones_for_shared_words():
    """An app trying the demo embeds a list of texts and searches them: it gets one unit
    vector per input in order, the same text the same vector, texts sharing words closer
    than texts sharing none; `dimensions` and base64 as OpenAI's API has them."""
    adapter = quick("sim-embed")
    texts = ["red apple pie", "red apple", "blue ocean waves", "red apple pie"]

    result = await adapter.run(InferenceCall("embedding", "m", {"input": texts}, False, {}))

    vectors = [d["embedding"] for d in result["data"]]
    assert [d["index"] for d in result["data"]] == [0, 1, 2, 3]
    assert all(len(v) == simulated.EMBEDDING_DIMENSIONS for v in vectors)
    assert all(sum(x * x for x in v) == pytest.approx(1.0) for v in vectors)

    def dot(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert vectors[0] == vectors[3]
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2])
    assert result["usage"] == {"prompt_tokens": 11, "total_tokens": 11}

    one = {"input": "red apple", "dimensions": 4, "encoding_format": "base64"}
    packed = (await adapter.run(InferenceCall("embedding", "m", one, False, {})))["data"]
    assert len(packed) == 1
    floats = struct.unpack("<4f", base64.b64decode(packed[0]["embedding"]))
    assert sum(x * x for x in floats) == pytest.approx(1.0, rel=1e-6)

    tokens = {"input": [[1, 2, 3], [4]]}  # token arrays, as OpenAI's API takes them
    arrays = await adapter.run(InferenceCall("embedding", "m", tokens, False, {}))
    assert len(arrays["data"]) == 2 and arrays["usage"]["prompt_tokens"] == 4


async def test_usage_counts_the_prompts_words_whole_or_streamed():
    """A key's usage in a demo grows with what it sends: a prompt's words stand for its
    tokens, in a chat's messages or a completion's prompt."""
    adapter = quick("sim-usage")
    payload = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is a GPU"},
        ],
        "max_tokens": 3,
        "stream_options": {"include_usage": True},
    }

    whole = await adapter.run(InferenceCall("chat", "m", payload, False, {}))
    chunks = [c async for c in adapter.stream(InferenceCall("chat", "m", payload, True, {}))]
    text = await adapter.run(
        InferenceCall("completion", "m", {"prompt": "once upon", "max_tokens": 2}, False, {})
    )

    expected = {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}
    assert whole["usage"] == expected and chunks[-1]["usage"] == expected
    assert text["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


async def test_n_choices_whole_or_streamed_add_up_to_the_same_answer():
    """`n: 2` gives two choices; streamed, their chunks take turns, and put together as
    Switchyard stores a streamed answer they read as the unstreamed one."""
    adapter = quick("sim-n")
    payload = {**chat(3), "n": 2}

    whole = await adapter.run(InferenceCall("chat", "m", payload, False, {}))
    chunks = [c async for c in adapter.stream(InferenceCall("chat", "m", payload, True, {}))]

    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert whole["usage"]["completion_tokens"] == 6
    folded = chat_stream.Completion()
    for c in chunks:
        folded.add(c)
    assert folded.result()["choices"] == whole["choices"]
