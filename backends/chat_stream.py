"""An OpenAI chat or completion stream folded into the answer the server would have given
unstreamed: each choice by its index with its text, its reasoning and its tool calls (a
call's name and arguments arrive in pieces, keyed by the call's index), so that the answer
stored for a streamed request (the jobs API, the watch page, the dashboard) holds what the
caller received, not only the first choice's text."""

from typing import Any


class Completion:
    def __init__(self) -> None:
        self.head: dict[str, Any] = {}  # the last chunk's id, object, created, model
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.chat = False  # a part with a `delta` is a chat's, whatever its `object` says

    def add(self, chunk: dict[str, Any]) -> None:
        self.head = chunk
        self.usage = chunk.get("usage") or self.usage
        for part in chunk.get("choices") or []:
            if not isinstance(part, dict):
                continue
            index = part.get("index") if isinstance(part.get("index"), int) else 0
            choice = self.choices.setdefault(index, {"text": [], "reasoning": [], "calls": {}})
            delta = part.get("delta") if isinstance(part.get("delta"), dict) else {}
            self.chat |= "delta" in part
            choice["text"].append(text(delta.get("content")) or text(part.get("text")))
            choice["reasoning"].append(text(delta.get("reasoning_content")))
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    merge_call(choice["calls"], call)
            # The usage chunk that may end a stream has no choices: keep the last reason.
            choice["finish"] = part.get("finish_reason") or choice.get("finish")

    def result(self) -> dict[str, Any]:
        is_chat = self.chat or str(self.head.get("object", "")).startswith("chat")
        choices = [
            answer_choice(index, self.choices[index], is_chat) for index in sorted(self.choices)
        ]
        return {
            "id": self.head.get("id", ""),
            "object": "chat.completion" if is_chat else "text_completion",
            "created": self.head.get("created", 0),
            "model": self.head.get("model", ""),
            "choices": choices or [answer_choice(0, {}, is_chat)],
            "usage": self.usage,
        }


def text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def merge_call(calls: dict[int, dict[str, Any]], piece: dict[str, Any]) -> None:
    """A tool call's piece into the call of its index: its id, type and name come once,
    its arguments in parts to be joined."""
    index = piece.get("index") if isinstance(piece.get("index"), int) else len(calls)
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    for field in ("id", "type"):
        if isinstance(piece.get(field), str) and piece[field]:
            call[field] = piece[field]
    function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
    name = text(function.get("name"))
    if name != call["function"]["name"]:  # some servers say the whole name in every piece
        call["function"]["name"] += name
    call["function"]["arguments"] += text(function.get("arguments"))


def answer_choice(index: int, folded: dict[str, Any], is_chat: bool) -> dict[str, Any]:
    said = "".join(folded.get("text", []))
    finish = folded.get("finish") or "stop"
    if not is_chat:
        return {"index": index, "text": said, "finish_reason": finish}
    calls = [folded["calls"][i] for i in sorted(folded.get("calls", {}))]
    # As an unstreamed answer has it: no text beside tool calls is null, not "".
    message: dict[str, Any] = {"role": "assistant", "content": said or (None if calls else "")}
    if reasoning := "".join(folded.get("reasoning", [])):
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {"index": index, "message": message, "finish_reason": finish}
