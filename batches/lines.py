"""A batch's input file, line by line: each a JSON object
`{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {...}}`, its body
checked as the endpoint checks a request's. Any bad line refuses the whole batch, naming
the line; nothing is stored."""

import json
from dataclasses import dataclass

from access import limits
from access.models import ApiKey
from backends.models import Model
from scheduler.api import intake
from scheduler.api.errors import ApiError

CUSTOM_ID_MAX = 512


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based, as an editor shows it
    custom_id: str
    body: dict
    model: Model


def bad_file(message: str) -> ApiError:
    return ApiError(400, message, param="input_file_id", code="invalid_batch_file")


def parse(text: str, kind: str, endpoint: str, api_key: ApiKey | None, most: int) -> list[Line]:
    """The lines of `text`, each checked; ApiError 400 at the first bad one."""
    found: list[Line] = []
    seen: set[str] = set()
    models: dict[str, Model] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(found) == most:
            raise bad_file(
                f"A batch holds at most {most} requests (SWITCHYARD_BATCH_MAX_REQUESTS)."
            )
        line = _line(number, raw, kind, endpoint, api_key, models)
        if line.custom_id in seen:
            raise bad_file(
                f"Line {number}: custom_id `{line.custom_id}` is already used by an earlier line."
            )
        seen.add(line.custom_id)
        found.append(line)
    if not found:
        raise bad_file("The input file holds no requests (one JSON object a line).")
    return found


def _line(
    number: int, raw: str, kind: str, endpoint: str, api_key: ApiKey | None, models: dict
) -> Line:
    try:
        item = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        raise bad_file(f"Line {number} is not JSON.") from None
    if not isinstance(item, dict):
        raise bad_file(f"Line {number} is not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > CUSTOM_ID_MAX:
        raise bad_file(
            f"Line {number}: custom_id must be a string of 1 to {CUSTOM_ID_MAX} characters."
        )
    if item.get("method", "POST") != "POST":
        raise bad_file(f"Line {number}: method must be POST.")
    if item.get("url") != endpoint:
        raise bad_file(f"Line {number}: url must be the batch's endpoint, {endpoint}.")
    try:
        body = dict(intake.validate_body(kind, item.get("body")))
        name = body["model"]
        if name not in models:  # each name checked once, however many lines use it
            limits.check_model(api_key, name, intake.names_of)
            models[name] = intake.resolve(name, kind)
    except ApiError as error:
        raise ApiError(
            error.status, f"Line {number}: {error.message}", param="input_file_id", code=error.code
        ) from None
    body.pop("stream", None)  # a batch's answers are whole
    body.pop("priority", None)  # and all of one class
    return Line(number, custom_id, body, models[name])
