"""The component schemas of what the bare-ASGI inference endpoints and the plain Django
views take and answer, which drf-spectacular cannot see; `openapi.complete` adds them to
the schema it generates."""

from typing import Any

from .. import reasons
from ..models import RequestKind

REF = "#/components/schemas/"


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {
            "type": "string",
            "enum": ["system", "developer", "user", "assistant", "tool", "function"],
        },
        "content": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {}}],
            "nullable": True,
        },
    },
}
SAMPLING = {
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "presence_penalty": {"type": "number"},
    "frequency_penalty": {"type": "number"},
    "seed": {"type": "integer"},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "user": {"type": "string"},
    "prompt_cache_key": {
        "type": "string",
        "description": "Names the conversation: its turns go to the server that ran the last"
        " one while it has a free slot (prompt-cache affinity).",
    },
    "priority": {"type": "string", "enum": ["interactive", "high", "normal", "background"]},
}
TOKENS = {
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
    ]
}
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string", "example": "invalid_request_error"},
                    "param": {"type": "string", "nullable": True},
                    "code": {"type": "string", "nullable": True, "example": "model_not_found"},
                },
            }
        },
    },
    "AnthropicError": {
        "type": "object",
        "description": "An error on Anthropic's paths, in Anthropic's shape; Switchyard's"
        " `param` and `code` beside where it has them.",
        "required": ["type", "error"],
        "properties": {
            "type": {"type": "string", "enum": ["error"]},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": {"type": "string", "example": "not_found_error"},
                    "message": {"type": "string"},
                    "param": {"type": "string"},
                    "code": {"type": "string", "example": "model_not_found"},
                },
            },
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
            "stream": {"type": "boolean"},
            **SAMPLING,
        },
        "additionalProperties": True,
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": {"type": "string"},
            "prompt": TOKENS,
            "stream": {"type": "boolean"},
            **SAMPLING,
        },
        "additionalProperties": True,
    },
    "EmbeddingRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string"},
            "input": TOKENS,
            "dimensions": {"type": "integer", "minimum": 1},
            "encoding_format": {"type": "string"},
        },
        "additionalProperties": True,
    },
    "RerankRequest": {
        "type": "object",
        "required": ["model", "query", "documents"],
        "properties": {
            "model": {"type": "string"},
            "query": {"type": "string"},
            "documents": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "top_n": {"type": "integer", "minimum": 1},
        },
        "additionalProperties": True,
    },
    "ResponseRequest": {
        "type": "object",
        "description": "OpenAI's Responses API: `input` is text or an array of input items;"
        " streamed, its events end with `response.completed`.",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {}}]},
            "instructions": {"type": "string"},
            "stream": {"type": "boolean"},
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number"},
            "top_p": {"type": "number"},
            "priority": SAMPLING["priority"],
        },
        "additionalProperties": True,
    },
    "MessageRequest": {
        "type": "object",
        "description": "Anthropic's Messages API (the key may come as `x-api-key`); streamed,"
        " its named events end with `message_stop`.",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {
                        "role": {"type": "string", "enum": ["user", "assistant", "system"]},
                        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {}}]},
                    },
                },
            },
            "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": {}}]},
            "max_tokens": {"type": "integer", "minimum": 1},
            "stream": {"type": "boolean"},
            "temperature": {"type": "number"},
            "priority": SAMPLING["priority"],
        },
        "additionalProperties": True,
    },
    "OpenAIResponse": {
        "type": "object",
        "description": "The server's answer in OpenAI's shape (chat.completion, text_completion,"
        " response or list; for a rerank, results of index and relevance_score, best first;"
        " for /v1/messages, Anthropic's message; for its count_tokens, input_tokens).",
        "additionalProperties": True,
    },
    "Model": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "type": {"type": "string", "enum": ["llm", "embedding", "reranking"]},
            "capabilities": {
                "type": "array",
                "items": {"type": "string", "enum": ["tools", "vision", "thinking"]},
                "description": "What it takes besides text; absent where unknown.",
            },
            "context_length": {
                "type": "integer",
                "description": "Tokens of context a request may use; absent where unknown.",
            },
        },
    },
    "ModelList": {
        "type": "object",
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": ref("Model")},
        },
    },
    "RequestDetail": {
        "type": "object",
        "description": "A request as the jobs API shows it (also a callback's body).",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "kind": {"type": "string", "enum": RequestKind.values},
            "model": {"type": "string"},
            "priority": {"type": "string", "enum": ["interactive", "high", "normal", "background"]},
            "state": {
                "type": "string",
                "enum": [
                    "pending",
                    "needs_loading",
                    "ready",
                    "processing",
                    "completed",
                    "failed",
                    "cancelled",
                    "expired",
                ],
            },
            "position": {
                "type": "integer",
                "nullable": True,
                "description": "1-based, while waiting",
            },
            "eta_s": {
                "type": "number",
                "nullable": True,
                "description": "Seconds until it is sent to a server while it waits (the first"
                " 1,000 in line), or until it is expected to end while it runs; null once ended.",
            },
            "reason": {
                "type": "object",
                "nullable": True,
                "description": "While it waits, why: as the last scheduling pass that changed"
                " it said (a load's progress counted to now); `behind N requests in line` for"
                " a request a pass has not reached yet; null once it no longer waits.",
                "properties": {
                    "kind": {
                        "type": "string",
                        "enum": [*reasons.KINDS],
                    },
                    "text": {"type": "string"},
                    "details": {"type": "object", "additionalProperties": True},
                },
            },
            "server": {"type": "string", "nullable": True},
            **{
                name: {"type": "string", "format": "date-time", "nullable": True}
                for name in (
                    "created_at",
                    "routed_at",
                    "ready_at",
                    "started_at",
                    "finished_at",
                    "expires_at",
                )
            },
            "attempts": {"type": "integer"},
            "error": {"type": "string"},
            "error_code": {"type": "string"},
            "result": {"type": "object", "nullable": True, "additionalProperties": True},
            "trace": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "at": {"type": "string", "format": "date-time"},
                        "from_state": {"type": "string"},
                        "to_state": {"type": "string"},
                        "server": {"type": "string"},
                        "reason": {"type": "string"},
                    },
                },
            },
        },
    },
    "Health": {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["ok", "ready", "unavailable"]},
            "failures": {"type": "array", "items": {"type": "string"}},
            "checked_in_s": {"type": "number"},
        },
    },
}
