"""What drf-spectacular cannot see, added to the schema it generates: the bare-ASGI inference
endpoints, the plain Django views (`/v1/models`, a job's GET and DELETE, health, metrics),
the error shape on every operation, and the headers (their bodies' schemas:
`openapi_schemas`; Ollama's API: `ollama_openapi`, the hook after this one).
Kept next to the code it describes; tests/scheduler/test_openapi.py checks every URL the app
routes is in the schema."""

from typing import Any

from access.models import STREAM_PROGRESS

from .openapi_schemas import SCHEMAS, ref

ERROR_CODES = {
    400: "Bad input: the body, a field or a parameter (`param` names it)",
    401: "No login or token",
    403: "Not allowed",
    404: "No such endpoint, request, model, server or deployment",
    405: "Method not allowed here (see `Allow`)",
    409: "The state forbids it (already loaded, busy, not cancellable...)",
    413: "Body over DATA_UPLOAD_MAX_MEMORY_SIZE",
    415: "Not JSON",
    429: "Queue full, the key's pace or its daily quota (see `Retry-After`)",
    500: "A fault in Switchyard; its log tells why",
    502: "The inference server failed the request",
    503: "Expired, lost, or no server can serve it now (see `Retry-After`)",
}


def json_body(schema: dict, description: str = "") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def errors(*codes: int, schema: str = "Error") -> dict[str, Any]:
    return {str(c): json_body(ref(schema), ERROR_CODES[c]) for c in codes}


# The operator and jobs API's operations as a client generator names them (drf-spectacular
# names them after their path: `api_v1_servers_retrieve_2`).
OPERATION_IDS = {
    ("get", "/api/v1/config"): "config_read",
    ("post", "/api/v1/config"): "config_apply",
    ("get", "/api/v1/intents"): "intents_list",
    ("get", "/api/v1/key"): "key_own",
    ("get", "/api/v1/keys"): "keys_list",
    ("post", "/api/v1/keys"): "key_create",
    ("get", "/api/v1/keys/{prefix}"): "key_retrieve",
    ("patch", "/api/v1/keys/{prefix}"): "key_update",
    ("post", "/api/v1/keys/{prefix}/rotate-webhook-secret"): "key_rotate_webhook_secret",
    ("get", "/api/v1/queue"): "queue_list",
    ("post", "/api/v1/queue/cancel"): "queue_cancel",
    ("get", "/api/v1/requests"): "requests_list",
    ("post", "/api/v1/requests"): "request_create",
    ("get", "/api/v1/servers"): "servers_list",
    ("get", "/api/v1/servers/{name}"): "server_retrieve",
    ("get", "/api/v1/servers/{name}/check"): "server_check",
    ("post", "/api/v1/servers/{name}/drain"): "server_drain",
    ("post", "/api/v1/servers/{name}/enable"): "server_enable",
    ("post", "/api/v1/servers/{name}/load"): "server_load",
    ("post", "/api/v1/servers/{name}/sync"): "server_sync",
    ("post", "/api/v1/servers/{name}/unload"): "server_unload",
    ("get", "/api/v1/teams"): "teams_list",
    ("post", "/api/v1/teams"): "team_create",
    ("get", "/api/v1/teams/{name}"): "team_retrieve",
    ("patch", "/api/v1/teams/{name}"): "team_update",
    ("get", "/api/v1/usage"): "usage_report",
}
# The operator API: an operator key, or a staff login (its session cookie).
OPERATOR_SECURITY = [{"apiKey": []}, {"staffSession": []}]
WAIT_S = {
    "name": "wait_s",
    "in": "query",
    "required": False,
    "description": "Wait up to this many seconds (at most 300) for its end.",
    "schema": {"type": "number", "minimum": 0, "maximum": 300},
}
PRIORITY_HEADER = {
    "name": "X-Priority",
    "in": "header",
    "required": False,
    "description": "The class: interactive, high, normal (the default) or background.",
    "schema": {"type": "string"},
}
PROGRESS_HEADER = {
    "name": "X-Switchyard-Progress",
    "in": "header",
    "required": False,
    "description": "A streamed chat's wait: `reasoning` also shows it as `reasoning_content`"
    " chunks (chat apps show them as thinking), `comments` as SSE comments only. Unset:"
    " SWITCHYARD_STREAM_PROGRESS.",
    "schema": {"type": "string", "enum": list(STREAM_PROGRESS)},
}
REQUEST_ID = {
    "X-Request-Id": {
        "schema": {"type": "string", "format": "uuid"},
        "description": "The request's id",
    }
}
RATE_LIMITS = {
    f"x-ratelimit-{part}-{unit}": {"schema": {"type": "string"}, "description": text}
    for unit, what in (
        ("requests", "`rpm`"),
        ("tokens", "daily token quota (or its team's, if fewer are left there)"),
    )
    for part, text in (
        ("limit", f"The key's {what}, where it has one"),
        ("remaining", "What is left of it after this request"),
        ("reset", "When more is left (`45s`, `1m0s`, `13h5m25s`)"),
    )
}
JOB_ID = {
    "name": "request_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}


def inference(summary: str, body: str, streams: bool, error: str = "Error") -> dict[str, Any]:
    ok = json_body(
        ref("OpenAIResponse"), "The answer" + (", or with `stream` SSE events" if streams else "")
    )
    ok["headers"] = REQUEST_ID | RATE_LIMITS
    if streams:
        ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "operationId": summary.lower().replace(" ", "_"),
            "summary": summary,
            "tags": ["inference"],
            "parameters": [PRIORITY_HEADER, *([PROGRESS_HEADER] if streams else [])],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(body)}},
            },
            "responses": {
                "200": ok,
                **errors(400, 404, 405, 409, 413, 429, 500, 502, 503, schema=error),
            },
        }
    }


def paths() -> dict[str, Any]:
    return {
        "/v1/chat/completions": inference("Chat completion", "ChatCompletionRequest", True),
        "/v1/completions": inference("Completion", "CompletionRequest", True),
        "/v1/embeddings": inference("Embeddings", "EmbeddingRequest", False),
        "/v1/rerank": inference("Rerank", "RerankRequest", False),
        "/v1/responses": inference("Response", "ResponseRequest", True),
        "/v1/messages": inference("Message", "MessageRequest", True, "AnthropicError"),
        "/v1/messages/count_tokens": inference(
            "Message token count", "MessageRequest", False, "AnthropicError"
        ),
        "/v1/models": {
            "get": {
                "operationId": "models_list",
                "summary": "Every model by name and alias",
                "description": "In Anthropic's shape (LLMs only) for a call with an"
                " `anthropic-version` header.",
                "tags": ["inference"],
                "responses": {"200": json_body(ref("ModelList")), **errors(405)},
            }
        },
        "/v1/models/{name}": {
            "get": {
                "operationId": "models_retrieve",
                "summary": "One model, by name or alias",
                "tags": ["inference"],
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": json_body(ref("Model")), **errors(404, 405)},
            }
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "operationId": "files_content",
                "summary": "A file's content (a batch's input, answers or errors: JSONL)",
                "tags": ["batches"],
                "parameters": [
                    {
                        "name": "file_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {
                    "200": {
                        "description": "The file as uploaded or written",
                        "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                    },
                    **errors(404, 405),
                },
            }
        },
        "/api/v1/requests/{request_id}": {
            "get": {
                "operationId": "request_retrieve",
                "summary": "A request's state, place in line, trace and result",
                "tags": ["jobs"],
                "parameters": [JOB_ID, WAIT_S],
                "responses": {"200": json_body(ref("RequestDetail")), **errors(400, 404, 405, 503)},
            },
            "delete": {
                "operationId": "request_cancel",
                "summary": "Cancel a request, stopping it at its server if processing",
                "tags": ["jobs"],
                "parameters": [JOB_ID],
                "responses": {"200": json_body(ref("RequestDetail")), **errors(404, 405, 409)},
            },
        },
        "/api/v1/intents/{intent_id}": {
            "get": {
                "operationId": "intent_retrieve",
                "summary": "An operator's intent, finished or not (operators)",
                "tags": ["api"],
                "security": OPERATOR_SECURITY,
                "parameters": [
                    {
                        "name": "intent_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer"},
                    },
                    WAIT_S,
                ],
                "responses": {
                    "200": json_body(ref("IntentOut")),
                    **errors(400, 401, 403, 405),
                    "404": json_body(ref("Error"), "No such intent"),
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: 200 while the process serves",
                "tags": ["operations"],
                "security": [],
                "responses": {"200": json_body(ref("Health")), **errors(405)},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: database, channel layer, a live worker",
                "tags": ["operations"],
                "security": [],
                "responses": {
                    "200": json_body(ref("Health")),
                    "503": json_body(ref("Health"), "What failed"),
                    **errors(405),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (staff login or SWITCHYARD_METRICS_TOKEN)",
                "tags": ["operations"],
                "security": [{"metricsToken": []}, {"staffSession": []}],
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **errors(401),
                },
            }
        },
    }


def complete(result: dict[str, Any], generator, request, public: bool) -> dict[str, Any]:
    """drf-spectacular's postprocessing hook: add what it cannot see, and the error shape,
    security and headers on what it generated."""
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(SCHEMAS)
    schemes = components.setdefault("securitySchemes", {})
    schemes["staffSession"] = {"type": "apiKey", "in": "cookie", "name": "sessionid"}
    schemes["metricsToken"] = {"type": "http", "scheme": "bearer"}
    schemes["apiKey"] = {"type": "http", "scheme": "bearer", "description": "An API key"}
    for path, item in result["paths"].items():
        for method, operation in item.items():
            operation["operationId"] = OPERATION_IDS.get((method, path), operation["operationId"])
            responses = operation["responses"]
            for status, response in list(responses.items()):
                if int(status) >= 400:
                    responses[status] = json_body(ref("Error"), response.get("description", ""))
            responses.update({k: v for k, v in errors(400, 405, 500).items() if k not in responses})
            if {"staffSession": []} in operation.get("security", []):  # an operator's view
                operation["security"] = OPERATOR_SECURITY
            if path == "/api/v1/requests" and method == "post":
                operation.setdefault("parameters", []).append(PRIORITY_HEADER)
                responses["202"]["headers"] = {
                    "Location": {"schema": {"type": "string"}},
                    **RATE_LIMITS,
                }
                responses.update(errors(404, 413, 415, 429))
    result["paths"].update(paths())
    result["security"] = [{"apiKey": []}]  # the apps' calls: keys are required by default
    return result
