"""The shapes of the OpenAI fields a server reads, checked at the door: a field of the wrong
type is refused with a 400 that names it, and nothing is stored, instead of being sent after
a wait and failing on the server (`max_tokens: "ten"` came back as a 502)."""

from typing import Any

from ..models import RequestKind
from .errors import ApiError

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _tokens(v: Any) -> bool:
    """Text, or token ids, or a list of either (a prompt or an embedding's input)."""
    if isinstance(v, str):
        return True
    if not isinstance(v, list) or not v:
        return False
    return all(
        isinstance(x, str)
        or _integer(x)
        or (isinstance(x, list) and x and all(_integer(t) for t in x))
        for x in v
    )


# field: (check, what it must be)
TYPES: dict[str, tuple[Any, str]] = {
    "max_tokens": (_integer, "an integer"),
    "max_completion_tokens": (_integer, "an integer"),
    "max_output_tokens": (_integer, "an integer"),
    "n": (_integer, "an integer"),
    "seed": (_integer, "an integer"),
    "best_of": (_integer, "an integer"),
    "top_logprobs": (_integer, "an integer"),
    "dimensions": (_integer, "an integer"),
    "temperature": (_number, "a number"),
    "top_p": (_number, "a number"),
    "presence_penalty": (_number, "a number"),
    "frequency_penalty": (_number, "a number"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "echo": (lambda v: isinstance(v, bool), "a boolean"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "prompt_cache_key": (lambda v: isinstance(v, str), "a string"),
    "suffix": (lambda v: v is None or isinstance(v, str), "a string"),
    "encoding_format": (lambda v: isinstance(v, str), "a string"),
    "stop": (lambda v: v is None or _strings(v), "a string or an array of strings"),
    "stream_options": (lambda v: v is None or isinstance(v, dict), "an object"),
    "response_format": (lambda v: isinstance(v, dict), "an object"),
    "logit_bias": (lambda v: v is None or isinstance(v, dict), "an object"),
    "tools": (lambda v: isinstance(v, list), "an array"),
    "tool_choice": (lambda v: isinstance(v, str | dict), "a string or an object"),
    "top_n": (_integer, "an integer"),
    "return_documents": (lambda v: isinstance(v, bool), "a boolean"),
}
AT_LEAST_ONE = (
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "best_of",
    "dimensions",
    "top_n",
)


def storable(text: str) -> bool:
    """Text the database can keep: no NUL (PostgreSQL's text and jsonb refuse it) and no
    lone surrogate (JSON's \\ud800 escapes; not encodable as UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_text(body: Any) -> None:
    """Every key and string in the body storable; walked without recursion (a body may be
    nested as deep as the parser allows)."""
    stack = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            strings: Any = (value,)
        elif isinstance(value, dict):
            strings = value.keys()
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
            continue
        else:
            continue
        if not all(storable(text) for text in strings):
            raise invalid_value(
                None, "text may not contain NUL characters (\\u0000) or lone surrogates"
            )


def check(kind: str, body: dict[str, Any]) -> None:
    """Raise a 400 naming the first field that a server could not take."""
    check_text(body)
    for name, (ok, what) in TYPES.items():
        if name in body and not ok(body[name]):
            raise invalid_type(name, f"{name} must be {what}")
    for name in AT_LEAST_ONE:
        if name in body and body[name] < 1:
            raise invalid_value(name, f"{name} must be 1 or more")
    if kind == RequestKind.CHAT:
        for i, message in enumerate(body["messages"]):
            check_message(i, message)
    elif kind == RequestKind.COMPLETION and not _tokens(body["prompt"]):
        raise invalid_type("prompt", "prompt must be a string, an array of strings or tokens")
    elif kind == RequestKind.EMBEDDING and not _tokens(body["input"]):
        raise invalid_type("input", "input must be a string, an array of strings or tokens")
    elif kind == RequestKind.RESPONSE and not (
        isinstance(body["input"], str) or (isinstance(body["input"], list) and body["input"])
    ):
        raise invalid_type("input", "input must be a string or a non-empty array of items")
    elif kind in (RequestKind.MESSAGE, RequestKind.COUNT_TOKENS):
        check_anthropic(body)
    elif kind == RequestKind.RERANK:
        if not isinstance(body["query"], str):
            raise invalid_type("query", "query must be a string")
        documents = body.get("documents")
        if not (isinstance(documents, list) and documents and _strings(documents)):
            raise invalid_type("documents", "documents must be a non-empty array of strings")


def check_anthropic(body: dict[str, Any]) -> None:
    """An Anthropic message's body: `messages` of user and assistant turns (and system ones,
    which Claude Code sends mid-conversation under Anthropic's `mid-conversation-system`
    beta), each with text or content blocks; `system` text or blocks."""
    if "system" in body and not isinstance(body["system"], str | list):
        raise invalid_type("system", "system must be a string or an array of content blocks")
    for i, message in enumerate(body["messages"]):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid_type(where, f"{where} must be an object with a role and content")
        if message.get("role") not in ("user", "assistant", "system"):
            raise invalid_value(f"{where}.role", f"{where}.role must be user, assistant or system")
        if not isinstance(message.get("content"), str | list):
            raise invalid_type(
                f"{where}.content", f"{where}.content must be a string or an array of blocks"
            )


def check_message(i: int, message: Any) -> None:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid_type(where, f"{where} must be an object with a role and content")
    role = message.get("role")
    if role not in ROLES:
        raise invalid_value(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
    content = message.get("content")
    if content is None:
        if role == "assistant" and ("tool_calls" in message or "function_call" in message):
            return
        raise ApiError(
            400, f"{where}.content is required", param=f"{where}.content", code="missing"
        )
    if not isinstance(content, str | list):
        raise invalid_type(f"{where}.content", f"{where}.content must be a string or an array")


def invalid_type(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_type")


def invalid_value(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")
