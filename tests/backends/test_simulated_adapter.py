"""The simulated server keeps its configured pace: late wake-ups do not add up."""

import pytest

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
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
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
        return [finish(c) async for c in adapter.stream(call)][-1]

    cut = await adapter.run(InferenceCall("chat", "m", chat(3), False, {}))
    whole = await adapter.run(InferenceCall("chat", "m", uncapped, False, {}))
    text = await adapter.run(InferenceCall("completion", "m", {"prompt": "hi"}, False, {}))

    assert (finish(cut), cut["usage"]["completion_tokens"]) == ("length", 3)
    assert (finish(whole), whole["usage"]["completion_tokens"]) == ("stop", 16)
    assert finish(text) == "stop"
    assert await streamed_finish(chat(3)) == "length"
    assert await streamed_finish(uncapped) == "stop"
