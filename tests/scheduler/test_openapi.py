"""The OpenAPI schema covers every endpoint, the docs page serves it from local assets, and
inputs generated from the schema (schemathesis, on Hypothesis) never get a 5xx or an error
that is not JSON in the OpenAI shape from a live process."""

import os
import re
import threading

import httpx
import pytest
import schemathesis
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from access.models import ApiKey
from scheduler import health
from scheduler.api import ollama_openapi, openai_asgi
from tests import factories

# Examples per operation (about 15 of them): a few thousand requests in all, within a minute
# or two on a 2-core machine. SWITCHYARD_FUZZ_EXAMPLES raises it for a longer hunt.
EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES", "150"))


def routed(resolver: URLResolver, prefix: str = "") -> list[str]:
    """Every API path the URL conf routes, in OpenAPI's spelling ({name})."""
    found = []
    for entry in resolver.url_patterns:
        pattern = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            found += routed(entry, pattern)
        elif isinstance(entry, URLPattern):
            found.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", pattern))
    return found


@pytest.mark.django_db
def test_every_endpoint_is_in_the_schema(client):
    schema = client.get("/api/schema/", {"format": "json"}).json()
    api = [p for p in routed(get_resolver()) if p.startswith(("/v1/", "/api/v1/"))]
    expected = {*api, *openai_asgi.KINDS, *health.PATHS, "/metrics", *ollama_openapi.PATH_SET}
    assert expected <= set(schema["paths"]), expected - set(schema["paths"])
    for path, item in schema["paths"].items():
        shape = "OllamaError" if path in ollama_openapi.PATH_SET else "Error"
        if path.startswith("/v1/messages"):
            shape = "AnthropicError"
        for method, operation in item.items():
            errors = [s for s in operation["responses"] if s.startswith(("4", "5"))]
            assert errors, (method, path)
            for status in errors:
                body = operation["responses"][status]["content"]["application/json"]["schema"]
                assert body == {"$ref": f"#/components/schemas/{shape}"} or path == "/readyz"


@pytest.mark.django_db
def test_every_operation_has_a_name_of_its_own(client):
    """A client generator names its methods after them: `server_retrieve`, never the path's
    `api_v1_servers_retrieve_2`."""
    schema = client.get("/api/schema/", {"format": "json"}).json()
    ids = [op["operationId"] for item in schema["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    assert not [i for i in ids if i.startswith("api_v1_") or re.search(r"_\d+$", i)]


@pytest.mark.django_db
def test_the_schema_says_who_may_call_each_operation(client):
    """An app's key by default; the operator API an operator key or a staff login; the
    health checks and Ollama's version nobody in particular."""
    schema = client.get("/api/schema/", {"format": "json"}).json()
    assert schema["security"] == [{"apiKey": []}]
    operator = [{"apiKey": []}, {"staffSession": []}]
    paths = schema["paths"]
    for path in ("/api/v1/servers", "/api/v1/intents/{intent_id}", "/api/v1/keys", "/api/v1/usage"):
        assert paths[path]["get"]["security"] == operator, path
    for path in ("/healthz", "/readyz", "/api/version"):
        assert paths[path]["get"]["security"] == [], path
    assert "security" not in paths["/v1/chat/completions"]["post"]  # the default: a key


@pytest.mark.django_db
def test_the_docs_page_loads_nothing_from_elsewhere(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/") for s in sources), sources
    for source in sources:
        assert client.get(source).status_code == 200, source


def error_is_json_in_its_apis_shape(ctx, response, case) -> None:
    if response.status_code < 400:
        return
    headers = {k.lower(): v for k, v in response.headers.items()}
    kind = headers.get("content-type", "")
    kind = kind[0] if isinstance(kind, list) else kind
    assert kind.startswith("application/json"), (
        f"{response.status_code} {kind}: {response.text[:200]}"
    )
    error = response.json()["error"]
    if case.path in ollama_openapi.PATH_SET:  # Ollama's shape, for Ollama's clients
        assert isinstance(error, str) and error, error
        return
    if case.path.startswith("/v1/messages"):  # Anthropic's, for Anthropic's clients
        assert response.json()["type"] == "error", response.text
        assert {"type", "message"} <= set(error) <= {"type", "message", "param", "code"}, error
        return
    assert set(error) == {"message", "type", "param", "code"}, error


@pytest.mark.django_db(transaction=True)
def test_generated_inputs_never_get_a_5xx_or_a_non_json_error(served):
    srv = factories.server("sim", slots=4)
    factories.deployment(srv, "m", load_options={"tokens_per_second": 1_000_000})
    factories.model("e", type="embedding")
    factories.deployment(srv, "e")
    # Keys required, as in production: one key with the operator flag reads the schema
    # (401 without it) and calls every endpoint, the operator API's too.
    api_key, key = ApiKey.generate("fuzz", operator=True)
    api_key.save()
    headers = {"Authorization": f"Bearer {key}"}
    live = served(SWITCHYARD_AUTH="required")
    # Its log (a line per refused request) read as it comes: a full pipe would stall it.
    threading.Thread(target=lambda: live.log.extend(live.proc.stdout), daemon=True).start()
    schema_url = f"{live.url}/api/schema/?format=json"
    assert httpx.get(schema_url).status_code == 401
    schema = schemathesis.openapi.from_url(schema_url, headers=headers)
    checked = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,  # the same inputs on every run: a failure is reproducible
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def call(case) -> None:
            case.call_and_validate(
                base_url=live.url,
                headers=headers,
                checks=[not_a_server_error, error_is_json_in_its_apis_shape],
                timeout=30,
            )

        call()
        checked += 1
    assert checked >= 21
    assert httpx.get(f"{live.url}/healthz").status_code == 200  # still serving
