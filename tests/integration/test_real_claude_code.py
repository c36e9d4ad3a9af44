"""Opt-in (`SWITCHYARD_TEST_CLAUDE_CODE=1`, not in the default run): Claude Code itself
(npm `@anthropic-ai/claude-code` 2.1.197, `scripts/install_claude_code.sh`) pointed at
Switchyard (`ANTHROPIC_BASE_URL`, a Switchyard key as `ANTHROPIC_API_KEY`) in front of the
real llama.cpp router, on a tiny random-weight model with room for its prompt. The model
says nothing useful; what is tested is that every call Claude Code makes is taken, queued,
streamed back and read: its answers end at the output limit Claude Code set, which it
reports, as it would for a real model."""

import os
import subprocess
from pathlib import Path

import pytest

from access.models import ApiKey
from scheduler.models import Request, State
from tests.integration.test_real_llama_router import discovered
from tests.support import real_llama

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")
from tests.support import tiny_gguf  # noqa: E402 (needs gguf)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("SWITCHYARD_TEST_CLAUDE_CODE") != "1",
        reason="opt-in: SWITCHYARD_TEST_CLAUDE_CODE=1",
    ),
]
VERSION = "2.1.197"
OUTPUT_TOKENS = 16


def claude_binary() -> Path:
    root = os.environ.get("SWITCHYARD_CACHE") or (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "switchyard"
    )
    return Path(root) / f"claude-code-{VERSION}" / "node_modules" / ".bin" / "claude"


@pytest.fixture
def router(llama_server_binary, tmp_path):
    claude = claude_binary()
    if not claude.exists():
        pytest.skip(f"no Claude Code at {claude}: scripts/install_claude_code.sh installs it")
    model = tiny_gguf.build(tiny_gguf.LONG, tmp_path)
    sections = {"*": {"c": 32768, "np": 1, "stop-timeout": 2}, "tiny": {"model": str(model)}}
    preset = tmp_path / "models.ini"
    preset.write_text(real_llama.preset(sections))
    server = real_llama.RealLlamaServer(["--models-preset", str(preset)], tmp_path)
    yield server
    server.stop()


def test_claude_code_through_switchyard(router, switchyard, tmp_path):
    discovered(router)
    live = switchyard(AUTH="required")
    api_key, secret = ApiKey.generate("claude-code")
    api_key.save()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": live.url,
        "ANTHROPIC_API_KEY": secret,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(OUTPUT_TOKENS),
    }
    ran = subprocess.run(
        [str(claude_binary()), "-p", "Say hello.", "--model", "tiny", "--max-turns", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = ran.stdout + ran.stderr
    assert f"exceeded the {OUTPUT_TOKENS} output token maximum" in said, (said, live.log())

    calls = list(Request.objects.order_by("created_at"))
    assert calls and {(r.kind, r.state, r.stream) for r in calls} == {
        ("message", State.COMPLETED, True)
    }
    assert {r.api_key_id for r in calls} == {api_key.pk}
    first = calls[0].result
    assert (first["stop_reason"], first["usage"]["output_tokens"]) == ("max_tokens", OUTPUT_TOKENS)
    usage = first["usage"]
    prompt = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert prompt > 10_000  # Claude Code's system prompt and tools, all of them through
