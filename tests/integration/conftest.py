"""The real llama.cpp `llama-server` (build b11434) with tiny generated models, and
Switchyard's own processes in front of it."""

import functools
from pathlib import Path

import pytest

from tests.support import polling, real_llama
from tests.support.switchyard_processes import Switchyard

WAIT_S = 60.0


@pytest.fixture(scope="session")
def tiny_models(request, tmp_path_factory) -> dict[str, str]:
    """The two tiny GGUF files by name, and a broken one ("broken": not a GGUF file), built
    on the first run and kept in pytest's cache dir (in a temporary dir without a cache)."""
    pytest.importorskip(
        "gguf", reason="needs the integration extra: pip install -e '.[integration]'"
    )
    from tests.support import tiny_gguf

    cache = getattr(request.config, "cache", None)
    directory = cache.mkdir("tiny-gguf") if cache else tmp_path_factory.mktemp("tiny-gguf")
    files = {
        spec.name: str(tiny_gguf.build(spec, directory))
        for spec in (tiny_gguf.SMALL, tiny_gguf.LARGE)
    }
    broken = Path(directory) / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(range(256)) * 4)  # a header, then nonsense
    files["broken"] = str(broken)
    return files


@pytest.fixture(scope="session")
def llama_server_binary() -> None:
    if not real_llama.binary().exists():
        pytest.skip(f"no llama-server at {real_llama.binary()}: `make llama-server` builds it")


@pytest.fixture
def router(llama_server_binary, tiny_models, tmp_path):
    """llama-server in router mode with room for one model (`--models-max 1`), from a preset:
    "tiny" (5 MB), "large" (100 MB, slower, with room for streams that outlast an unload's
    stop-timeout: with `context-shift` its streams run past the models' 512-token training
    context, which caps the slots, and 1,000 tokens take about 5 s here), "embed" (the tiny
    model with `embeddings = true`) and "broken". A short `stop-timeout` keeps unloads
    quick."""
    sections = {
        "*": {"c": 1024, "np": 2, "stop-timeout": 2},
        "tiny": {"model": tiny_models["tiny-5mb"]},
        "large": {"model": tiny_models["tiny-100mb"], "c": 8192, "context-shift": True},
        "embed": {"model": tiny_models["tiny-5mb"], "embeddings": True},
        "broken": {"model": tiny_models["broken"]},
    }
    preset = tmp_path / "models.ini"
    preset.write_text(real_llama.preset(sections))
    server = real_llama.RealLlamaServer(
        ["--models-preset", str(preset), "--models-max", "1"], tmp_path
    )
    yield server
    server.stop()


@pytest.fixture
def single(llama_server_binary, tiny_models, tmp_path):
    """Start a single-model llama-server: `single("tiny-5mb", "--sleep-idle-seconds", "1")`."""
    started: list[real_llama.RealLlamaServer] = []

    def start(
        name: str, *args: str, wait_loaded: bool = True, ctx: int = 512
    ) -> real_llama.RealLlamaServer:
        argv = ["-m", tiny_models[name], "--alias", name, "-c", str(ctx), "-np", "2", *args]
        started.append(real_llama.RealLlamaServer(argv, tmp_path, wait_loaded=wait_loaded))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def switchyard(transactional_db):
    """Start Switchyard's real processes on the test database (create servers and models
    first): the web app and a worker in processes of their own on PostgreSQL with Redis,
    or both in one (`manage.py serve`) on the embedded default."""
    started: list[Switchyard] = []

    def start(**knobs: str) -> Switchyard:
        started.append(Switchyard(knobs))
        return started[-1]

    yield start
    for s in started:
        s.stop()


# Integration facts (a load of a real model, a router's restart) take longer than most.
eventually = functools.partial(polling.eventually, timeout=WAIT_S)
