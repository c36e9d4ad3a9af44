"""Prompt caches across swaps (`llamacpp_slots`) against a replay of llama-server's slot
routes: the slots holding a prompt saved before an unload and restored after the next
load; a server that cannot save asked once; no failure of theirs in the way of a load or
an unload. The real router's side is tests/integration/test_real_llama_prompt_cache.py."""

from collections.abc import Callable
from functools import partial

import pytest

from backends.adapters.http import HttpAdapter
from backends.adapters.llamacpp_slots import PromptCaches, file_name
from tests.support.replay_server import Reply

MODEL = "org/qwen3:8b"
SLOTS = [
    {"id": 0, "n_ctx": 512, "is_processing": False, "n_prompt_tokens": 300},
    {"id": 1, "n_ctx": 512, "is_processing": False},  # never used: nothing to save
    {"id": 2, "n_ctx": 512, "is_processing": False, "n_prompt_tokens": 40},
]
OK = Reply(200, {"id_slot": 0, "n_saved": 300})
NOT_SET = Reply(
    501,
    {
        "error": {
            "code": 501,
            "message": "This server does not support slots action. Start it with"
            " `--slot-save-path`",
            "type": "not_supported_error",
        }
    },
)


@pytest.fixture
def make_adapter() -> Callable[[str], HttpAdapter]:
    return partial(HttpAdapter)


def posts(server) -> list[tuple[str, list[str], str]]:
    return [
        (s.path, s.query["action"], s.body["filename"]) for s in server.seen if s.method == "POST"
    ]


async def test_saved_before_the_unload_and_restored_after_the_load(server, adapter):
    server.on("GET", "/slots", Reply(200, SLOTS))
    server.on("POST", "/slots/0", OK)
    server.on("POST", "/slots/2", OK)
    caches = PromptCaches()
    await caches.save(adapter, MODEL)
    assert server.requests_to("GET", "/slots")[0].query == {"model": [MODEL]}
    await caches.restore(adapter, MODEL)
    assert posts(server) == [
        ("/slots/0", ["save"], file_name(MODEL, 0)),
        ("/slots/2", ["save"], file_name(MODEL, 2)),
        ("/slots/0", ["restore"], file_name(MODEL, 0)),
        ("/slots/2", ["restore"], file_name(MODEL, 2)),
    ]
    assert server.requests_to("POST", "/slots/0")[0].body["model"] == MODEL


async def test_a_restored_cache_nobody_used_is_restored_again(server, adapter):
    """Loaded, restored, evicted before any request used it (its slots then hold no
    prompt, so nothing is saved): its files are still its latest caches, and the next load
    restores them again. A slot saved later is restored beside them."""
    server.on("GET", "/slots", Reply(200, SLOTS[:2]), Reply(200, SLOTS[1:2]), Reply(200, SLOTS))
    for slot in (0, 2):
        server.on("POST", f"/slots/{slot}", OK)
    caches = PromptCaches()
    await caches.save(adapter, MODEL)
    await caches.restore(adapter, MODEL)
    await caches.save(adapter, MODEL)  # nothing holds a prompt: nothing saved
    await caches.restore(adapter, MODEL)
    await caches.save(adapter, MODEL)  # slots 0 and 2 hold prompts
    await caches.restore(adapter, MODEL)
    assert [p[:2] for p in posts(server)] == [
        ("/slots/0", ["save"]),
        ("/slots/0", ["restore"]),
        ("/slots/0", ["restore"]),
        ("/slots/0", ["save"]),
        ("/slots/2", ["save"]),
        ("/slots/0", ["restore"]),
        ("/slots/2", ["restore"]),
    ]


async def test_a_server_without_a_slot_save_path_is_asked_once(server, adapter):
    server.on("GET", "/slots", Reply(200, SLOTS))
    server.on("POST", "/slots/0", NOT_SET)
    caches = PromptCaches()
    await caches.save(adapter, MODEL)
    await caches.save(adapter, MODEL)
    await caches.restore(adapter, MODEL)
    assert server.calls() == [("GET", "/slots"), ("POST", "/slots/0")]


async def test_failures_are_logged_and_never_in_the_way(server, adapter, caplog):
    server.on("GET", "/slots", Reply(200, SLOTS))
    server.on("POST", "/slots/0", Reply(500, {"error": {"message": "disk full"}}))
    server.on("POST", "/slots/2", OK, Reply(400, {"error": {"message": "invalid slot file"}}))
    caches = PromptCaches()
    await caches.save(adapter, MODEL)  # slot 0 fails, slot 2 is saved
    await caches.restore(adapter, MODEL)  # its restore fails: the load still goes on
    assert [p[:2] for p in posts(server)] == [
        ("/slots/0", ["save"]),
        ("/slots/2", ["save"]),
        ("/slots/2", ["restore"]),
    ]
    assert "disk full" in caplog.text and "invalid slot file" in caplog.text


def test_file_names_are_safe_and_one_models_own():
    name = file_name(MODEL, 3)
    assert name.startswith("switchyard-org_qwen3_8b-") and name.endswith("-slot3.bin")
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-")
    assert file_name("a/b", 0) != file_name("a_b", 0)
