"""Prompt caches kept across Switchyard's swaps on the real llama.cpp router (b11434)
started with `--slot-save-path`: a model evicted for another and loaded back answers the
same long prompt from its restored cache, as its answer's `timings` say."""

import pytest

from scheduler.models import Request, State
from tests.integration.test_real_llama_router import assert_words, discovered, router_states
from tests.support import real_llama

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful assistant. " * 8  # a long system prompt, as an agent's is
LONG = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say something."}]


def start_router(tiny_models, tmp_path, **everywhere) -> real_llama.RealLlamaServer:
    sections = {
        "*": {"c": 1024, "np": 2, "stop-timeout": 2, **everywhere},
        "tiny": {"model": tiny_models["tiny-5mb"]},
        "large": {"model": tiny_models["tiny-100mb"]},
    }
    preset = tmp_path / "models.ini"
    preset.write_text(real_llama.preset(sections))
    return real_llama.RealLlamaServer(
        ["--models-preset", str(preset), "--models-max", "1"], tmp_path
    )


def timings_across_a_swap(router, switchyard) -> tuple[dict, dict]:
    """`tiny` answers the long prompt, `large` evicts it, `tiny` answers it again."""
    discovered(router, max_llm=1)
    live = switchyard()
    body = {"model": "tiny", "messages": LONG, "max_tokens": 4}
    first = live.post("/v1/chat/completions", body).json()
    assert "choices" in first, first
    assert_words(first["choices"][0]["message"]["content"])
    other = live.post("/v1/chat/completions", {**body, "model": "large"})
    assert other.status_code == 200, other.text
    assert router_states(router)["tiny"] == "unloaded"
    again = live.post("/v1/chat/completions", body).json()
    assert_words(again["choices"][0]["message"]["content"])
    assert [r.state for r in Request.objects.all()] == [State.COMPLETED] * 3
    return first["timings"], again["timings"]


def test_a_swapped_out_model_comes_back_with_its_prompt_cache(
    llama_server_binary, tiny_models, tmp_path, switchyard
):
    saved = tmp_path / "slots"
    saved.mkdir()
    router = start_router(tiny_models, tmp_path, **{"slot-save-path": f"{saved}/"})
    try:
        first, again = timings_across_a_swap(router, switchyard)
    finally:
        router.stop()
    assert first["cache_n"] == 0 and first["prompt_n"] > 100
    # All but the last token or so of the prompt came from the restored cache.
    assert again["cache_n"] >= first["prompt_n"] - 2 and again["prompt_n"] <= 2
    # One file per model and slot: `tiny`'s, and `large`'s, saved as `tiny` came back.
    names = sorted(p.name for p in saved.iterdir())
    assert [n.split("-")[1] for n in names] == ["large", "tiny"]
    assert all(n.endswith("-slot0.bin") or n.endswith("-slot1.bin") for n in names)


def test_without_a_slot_save_path_the_prompt_is_processed_again(
    llama_server_binary, tiny_models, tmp_path, switchyard
):
    router = start_router(tiny_models, tmp_path)
    try:
        first, again = timings_across_a_swap(router, switchyard)
    finally:
        router.stop()
    assert again["cache_n"] == 0 and again["prompt_n"] == first["prompt_n"]
