"""`check_servers`: each kind is told apart by read-only GETs of its own, against replays of
the documented APIs (the real llama-server in tests/integration); what is set up wrong is
named, line by line, and nothing changes."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from backends.checkup import ERROR, OK, WARN, check_server, identify
from backends.models import Deployment, Model, Server
from tests import factories
from tests.conftest import free_port
from tests.support.replay_server import Reply

pytestmark = pytest.mark.django_db

ANSWERS = {
    "lmstudio": ("GET", "/lmstudio-greeting", Reply(200, {"lmstudio": True})),
    "ollama": ("GET", "/", Reply(200, "Ollama is running")),
    "llamaswap": ("GET", "/running", Reply(200, {"running": []})),
    "lemonade": ("GET", "/api/v1/health", Reply(200, {"status": "ok", "all_models_loaded": []})),
    "llamacpp": ("GET", "/props", Reply(200, {"default_generation_settings": {"n_ctx": 512}})),
    "vllm": ("GET", "/v1/models", Reply(200, {"data": [{"id": "q", "owned_by": "vllm"}]})),
    "openai": ("GET", "/v1/models", Reply(200, {"object": "list", "data": []})),
}


@pytest.mark.parametrize("kind", list(ANSWERS))
def test_each_kind_is_told_by_what_it_alone_answers(server, kind):
    server.on(*ANSWERS[kind])
    assert identify(Server(name="s", kind="openai", base_url=server.url)).kind == kind
    assert all(seen.method == "GET" for seen in server.seen)  # asking changes nothing there


def test_lm_studio_answering_any_path_is_not_taken_for_another_kind(server):
    """LM Studio answers 200 "Unexpected endpoint" to every unknown path."""
    for path in ("/", "/running", "/api/v1/health", "/props", "/v1/models"):
        server.on("GET", path, Reply(200, "Unexpected endpoint or method. (GET). Returning 200"))
    assert identify(Server(name="s", base_url=server.url)).kind is None


def listing(*ids: str) -> Reply:
    return Reply(200, {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})


def test_a_controllable_server_set_up_as_openai_is_named_with_its_kind(server):
    server.on(*ANSWERS["ollama"])
    server.on("GET", "/v1/models", listing("qwen3:8b"))
    srv = factories.server("laptop", kind="openai", base_url=server.url)
    factories.deployment(srv, "qwen", server_model_id="qwen3:8b")

    report = check_server(srv)

    assert report.worst == WARN
    assert "answers as ollama, set up as openai" in str(report)
    assert "with kind ollama it can" in str(report)


def test_deployments_the_server_does_not_list_and_slots_it_disagrees_with(server):
    server.on("GET", "/v1/models", listing("qwen3-8b", "a", "b", "c", "d", "e", "f"))
    srv = factories.server("up", kind="openai", base_url=server.url)
    factories.deployment(srv, "qwen", server_model_id="qwen3-8b")
    factories.deployment(srv, "typo", server_model_id="qwen3-8B")
    before = list(Deployment.objects.values())

    report = check_server(srv)

    text = str(report)
    assert report.worst == ERROR
    assert "lists 7 models; 1 of its 2 deployments among them" in text
    assert "typo: the server lists no 'qwen3-8B'" in text
    assert "6 models it lists have no deployment here" in text and "a, b, c, d, e …" in text
    assert list(Deployment.objects.values()) == before


def test_a_deployments_slots_against_what_the_server_says(server):
    server.on("GET", "/props", Reply(200, {"default_generation_settings": {}, "total_slots": 2}))
    server.on("GET", "/v1/models", Reply(200, {"data": [{"id": "m.gguf", "object": "model"}]}))
    server.on("GET", "/health", Reply(200, {"status": "ok"}))
    srv = factories.server("one", kind="llamacpp", base_url=server.url)
    factories.deployment(srv, "m", server_model_id="m.gguf", slots=4)

    report = check_server(srv)

    assert [f.level for f in report.findings] == [OK, OK, WARN]
    assert "m: slots 4 here, the server serves 2 at once" in str(report)


def test_a_model_said_to_have_more_context_than_the_server_runs_it_with(server):
    """Apps size their prompts by the model's context length: a server that runs it with
    less refuses the longer ones. More context there than said is no fault."""
    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
    server.on("GET", "/props", Reply(200, props))
    server.on("GET", "/v1/models", Reply(200, {"data": [{"id": "m.gguf", "object": "model"}]}))
    server.on("GET", "/health", Reply(200, {"status": "ok"}))
    srv = factories.server("one", kind="llamacpp", base_url=server.url)
    factories.model("m", context_length=32768)
    factories.deployment(srv, "m", server_model_id="m.gguf")

    report = check_server(srv)

    assert [f.level for f in report.findings] == [OK, OK, WARN]
    assert "m: apps are told its context is 32768 tokens, the server runs it with 4096" in str(
        report
    )
    Model.objects.filter(name="m").update(context_length=2048)
    assert [f.level for f in check_server(srv).findings] == [OK, OK]


def test_nothing_answering_is_an_error_and_the_command_fails_on_it(server):
    server.on("GET", "/v1/models", listing("m"))
    factories.server("fine", kind="openai", base_url=server.url)
    factories.server("gone", kind="openai", base_url=f"http://127.0.0.1:{free_port()}")
    factories.server("sim", kind="simulated")
    out = StringIO()

    with pytest.raises(CommandError, match="to fix on: gone"):
        call_command("check_servers", stdout=out)

    text = out.getvalue()
    assert "fine: ok" in text and "gone: error" in text and "sim: ok" in text
    assert "nothing at http://127.0.0.1:" in text
    assert "cannot list its models" in text
    call_command("check_servers", "fine", stdout=StringIO())  # only the one asked: no error
    with pytest.raises(CommandError, match="no such server: nope"):
        call_command("check_servers", "nope")


ERROR_PAGE = """<!DOCTYPE HTML>
<html lang="en">
    <head>
        <meta charset="utf-8">
        <title>Error response</title>
        <style>body { font-family: sans-serif; }</style>
    </head>
    <body>
        <h1>Error response</h1>
        <p>Error code: 404</p>
        <p>Message: File not found.</p>
    </body>
</html>
"""


def test_a_web_page_at_the_address_is_said_on_one_line(server):
    """A server's address that reaches a web server (a proxy, a static site) answers error
    pages: the report says their text, not their HTML."""
    for path in ("/", "/api/tags", "/api/version", "/api/ps"):
        server.on("GET", path, Reply(404, ERROR_PAGE, {"Content-Type": "text/html"}))
    srv = factories.server("web", kind="ollama", base_url=server.url)

    finding = check_server(srv).findings[-1]

    assert (finding.level, finding.text) == (
        ERROR,
        "cannot list its models (kind ollama): Error response Error code: 404 Message: File"
        " not found.",
    )


def test_a_router_that_runs_fewer_models_than_switchyard_may_keep_there(server):
    """The router stops the least recently used model by itself beyond --models-max:
    Switchyard keeping more there would see its models vanish."""
    server.on("GET", "/props", Reply(200, {"role": "router", "max_instances": 1}))
    server.on(
        "GET",
        "/v1/models",
        Reply(200, {"data": [{"id": i, "status": {"value": "unloaded"}} for i in "me"]}),
    )
    srv = factories.server("router", kind="llamacpp", base_url=server.url, max_llm=1)
    factories.deployment(srv, "m")
    assert check_server(srv).worst == OK  # one LLM in a room for one

    factories.model("e", type="embedding")
    factories.deployment(srv, "e")
    report = check_server(srv)

    assert report.worst == WARN
    assert "the router runs at most 1 model at once (--models-max)" in str(report)
    assert "Switchyard may keep 2 there" in str(report)
    assert "set max models in all to 1 (a worker does as it reaches the server)" in str(report)

    srv.max_models = 1  # as a worker sets it: Switchyard keeps one model there in all
    srv.save()
    assert check_server(srv).worst == OK


def test_load_options_a_router_would_not_apply(server):
    """A router takes each model's arguments from its preset: a deployment's own load
    options there are named as not applied (its model's defaults, meant for other servers,
    are not)."""
    server.on("GET", "/props", Reply(200, {"role": "router", "max_instances": 0}))
    server.on(
        "GET", "/v1/models", Reply(200, {"data": [{"id": "m", "status": {"value": "unloaded"}}]})
    )
    srv = factories.server("router", kind="llamacpp", base_url=server.url)
    factories.model("m", load_options={"context_length": 4096})
    d = factories.deployment(srv, "m")
    assert check_server(srv).worst == OK
    d.load_options = {"context_length": 8192, "flash_attention": True}
    d.save()
    report = check_server(srv)
    assert report.worst == WARN
    assert "m: its load options (context_length, flash_attention) are not applied" in str(report)
