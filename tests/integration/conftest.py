"""A real llama-cpp-python server with tiny generated models, shared by the whole session."""

import pytest

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")
pytest.importorskip(
    "llama_cpp.server", reason="needs the integration extra: pip install -e '.[integration]'"
)

from tests.support import tiny_gguf  # noqa: E402 (needs gguf, checked above)
from tests.support.llama_server import LlamaServer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(request, tmp_path_factory) -> dict[str, str]:
    """The two tiny GGUF files by name, built on the first run and kept in pytest's cache
    dir (in a temporary dir when the cache is turned off)."""
    cache = getattr(request.config, "cache", None)
    directory = cache.mkdir("tiny-gguf") if cache else tmp_path_factory.mktemp("tiny-gguf")
    return {
        spec.name: str(tiny_gguf.build(spec, directory))
        for spec in (tiny_gguf.SMALL, tiny_gguf.LARGE)
    }


@pytest.fixture(scope="session")
def llama(tiny_models, tmp_path_factory):
    """llama_cpp.server with both models, plus the small one again with embeddings on
    (llama-cpp-python serves embeddings only from a model loaded with `embedding: true`).
    Its aliases: "tiny-5mb", "tiny-100mb", "tiny-embed"."""
    small, large = tiny_gguf.SMALL.name, tiny_gguf.LARGE.name
    server = LlamaServer(
        [
            {"model": tiny_models[small], "model_alias": small},
            {"model": tiny_models[large], "model_alias": large},
            {"model": tiny_models[small], "model_alias": "tiny-embed", "embedding": True},
        ],
        tmp_path_factory.mktemp("llama-server"),
    )
    yield server
    server.stop()
