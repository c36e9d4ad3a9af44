"""Ollama's API (`ollama_api`) in the OpenAPI schema, beside the OpenAI paths `openapi` adds:
what each call takes and answers, as far as Switchyard reads and writes it. Errors there are
Ollama's `{"error": "…"}`, not OpenAI's."""

from typing import Any

from .ollama_api import LISTING, NDJSON, OPTIONS, PATHS
from .openapi import json_body, ref

TAG = "ollama"
ERROR_CODES = {
    400: "Bad input",
    401: "No key",
    403: "The key may not use it",
    404: "No such model, or no server has it",
    405: "Method not allowed here",
    413: "Body over DATA_UPLOAD_MAX_MEMORY_SIZE",
    429: "Queue full, the key's pace or its daily quota (see `Retry-After`)",
    500: "A fault in Switchyard; its log tells why",
    502: "The inference server failed the request",
    503: "Expired, or no server can serve it now (see `Retry-After`)",
}
CALL_ERRORS = (400, 401, 403, 404, 405, 413, 429, 500, 502, 503)
PATH_SET = frozenset((*PATHS, *LISTING))


def errors(*codes: int) -> dict[str, Any]:
    return {str(c): json_body(ref("OllamaError"), ERROR_CODES[c]) for c in codes}


MODEL = {"type": "string", "description": "A model's name or alias, as `/api/tags` lists it."}
STREAM = {"type": "boolean", "default": True, "description": "Lines (NDJSON) unless false."}
COMMON = {
    "model": MODEL,
    "stream": STREAM,
    "format": {
        "oneOf": [{"type": "string", "enum": ["json"]}, {"type": "object"}],
        "description": '"json", or a JSON schema the answer must follow.',
    },
    "options": {
        "type": "object",
        "properties": {name: {} for name in OPTIONS},
        "additionalProperties": True,
        "description": "Sampling options; others (num_ctx among them) are ignored.",
    },
    "think": {
        "oneOf": [{"type": "boolean"}, {"type": "string", "enum": ["low", "medium", "high"]}]
    },
    "keep_alive": {
        "description": "Ignored: Switchyard decides when a model goes. On a call with nothing"
        " to run, 0 is answered done_reason unload (as `ollama stop` expects), unloading nothing."
    },
}
IMAGES = {"type": "array", "items": {"type": "string", "description": "Base64 image data"}}
SCHEMAS: dict[str, Any] = {
    "OllamaError": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    },
    "OllamaMessage": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
            "content": {"type": "string"},
            "images": IMAGES,
            "tool_calls": {"type": "array", "items": {"type": "object"}},
            "thinking": {"type": "string"},
        },
    },
    "OllamaChatRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **COMMON,
            "messages": {"type": "array", "items": ref("OllamaMessage")},
            "tools": {"type": "array", "items": {"type": "object"}},
        },
    },
    "OllamaGenerateRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {
            **COMMON,
            "prompt": {"type": "string"},
            "system": {"type": "string"},
            "images": IMAGES,
            "raw": {"type": "boolean", "description": "The prompt as it is: a completion."},
        },
    },
    "OllamaEmbedRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": MODEL,
            "input": {
                "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
            },
            "dimensions": {"type": "integer", "minimum": 1},
        },
    },
    "OllamaShowRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {"model": MODEL},
    },
    "OllamaAnswer": {
        "type": "object",
        "description": "Ollama's answer: `message` (chat) or `response` (generate), `done`,"
        " `done_reason` and token counts; `embeddings` for embed.",
        "additionalProperties": True,
    },
    "OllamaModelList": {
        "type": "object",
        "properties": {
            "models": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "model": {"type": "string"},
                        "size": {"type": "integer"},
                        "capabilities": {"type": "array", "items": {"type": "string"}},
                    },
                },
            }
        },
    },
    "OllamaShow": {
        "type": "object",
        "properties": {
            "capabilities": {"type": "array", "items": {"type": "string"}},
            "model_info": {"type": "object", "additionalProperties": True},
            "details": {"type": "object"},
        },
    },
}


def call(summary: str, body: str, streams: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": ref("OllamaAnswer")}}
    if streams:
        content[NDJSON] = {"schema": {"type": "string"}}
    return {
        "post": {
            "operationId": "ollama_" + summary.lower().replace(" ", "_"),
            "summary": summary,
            "tags": [TAG],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(body)}},
            },
            "responses": {
                "200": {"description": "The answer", "content": content},
                **errors(*CALL_ERRORS),
            },
        }
    }


def read(method: str, summary: str, answer: str, body: str | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": "ollama_" + summary.lower().replace(" ", "_"),
        "summary": summary,
        "tags": [TAG],
        "responses": {
            "200": json_body(ref(answer), summary),
            **errors(400, 401, 403, 404, 405),
        },
    }
    if body:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref(body)}},
        }
    return {method: operation}


def paths() -> dict[str, Any]:
    return {
        "/api/chat": call("Chat", "OllamaChatRequest", True),
        "/api/generate": call("Generate", "OllamaGenerateRequest", True),
        "/api/embed": call("Embed", "OllamaEmbedRequest", False),
        "/api/tags": read("get", "Models the key may use", "OllamaModelList"),
        "/api/ps": read("get", "Those loaded now", "OllamaModelList"),
        "/api/show": read("post", "What a model can do", "OllamaShow", "OllamaShowRequest"),
        "/api/version": {
            "get": {**read("get", "The Ollama API followed", "OllamaAnswer")["get"], "security": []}
        },
    }


def complete(result: dict[str, Any], generator, request, public: bool) -> dict[str, Any]:
    """drf-spectacular's postprocessing hook, after `openapi.complete`: Ollama's paths and
    the schemas they use."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
    result["paths"].update(paths())
    return result
