"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

import logging
from collections.abc import Awaitable, Callable

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework.exceptions import (
    APIException,
    NotFound,
    ParseError,
    UnsupportedMediaType,
    ValidationError,
)
from rest_framework.response import Response
from rest_framework.views import exception_handler

from ..faults import is_transient

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
        should_retry: bool = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        # False: the OpenAI clients' `x-should-retry` header tells them not to retry at once
        # (an answer that holds for hours).
        self.should_retry = should_retry
        self.extra_headers = headers or {}  # e.g. the limit's `x-ratelimit-*`

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        found = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else {}
        if not self.should_retry:
            found["x-should-retry"] = "false"
        return found | self.extra_headers

    def as_json_response(self) -> JsonResponse:
        return JsonResponse(self.body(), status=self.status, headers=self.headers())

    def as_drf_response(self) -> Response:
        return Response(self.body(), status=self.status, headers=self.headers())


def openai_exception_handler(exc, context) -> Response | None:
    if isinstance(exc, ApiError):
        return exc.as_drf_response()
    if is_transient(exc):  # the database or Redis, down: a 503, never a bare 500
        error = ApiError(
            503,
            f"A service Switchyard needs is not answering ({type(exc).__name__}). Try again.",
            type="server_error",
            code="unavailable",
            retry_after_s=1,
        )
        return error.as_drf_response()
    if isinstance(exc, RequestDataTooBig):
        return request_too_large().as_drf_response()
    response = exception_handler(exc, context)
    if response is None or not isinstance(exc, APIException):
        return response
    param = None
    if isinstance(exc, ValidationError) and isinstance(exc.detail, dict):
        param, detail = next(iter(exc.detail.items()))
        message = f"{param}: {detail[0] if isinstance(detail, list) else detail}"
    elif isinstance(exc, ValidationError) and isinstance(exc.detail, list):
        message = str(exc.detail[0])
    else:
        message = str(exc.detail)
    if isinstance(exc, UnsupportedMediaType):  # curl -d sends a form type unless told
        message += " Send JSON, with the header `Content-Type: application/json`."
    code = {ParseError: "invalid_json", NotFound: "not_found"}.get(type(exc), exc.default_code)
    error = ApiError(response.status_code, message, param=param, code=code)
    return Response(error.body(), status=response.status_code)


def request_too_large() -> ApiError:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return ApiError(
        413,
        f"The request body is larger than {limit} bytes (the setting DATA_UPLOAD_MAX_MEMORY_SIZE).",
        code="request_too_large",
    )


def too_deep() -> ApiError:
    return ApiError(400, "The JSON body is nested too deeply.", code="invalid_json")


def no_such_path(method: str, path: str) -> ApiError:
    hint = " (no path here ends with a slash)" if path.endswith("/") and path != "/" else ""
    return ApiError(
        404, f"No endpoint answers {method} {path}{hint}; see /api/docs/.", code="not_found"
    )


def error_for(exc: Exception, request: HttpRequest) -> ApiError:
    """What an exception that escaped a view means to the caller."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Http404):
        return no_such_path(request.method or "GET", request.path)
    if isinstance(exc, RequestDataTooBig):
        return request_too_large()
    if isinstance(exc, PermissionDenied):
        return ApiError(403, "You may not do this.", code="permission_denied")
    if isinstance(exc, SuspiciousOperation | BadRequest):
        return ApiError(400, "The request is malformed.", code="bad_request")
    log.error("%s %s failed", request.method, request.path, exc_info=exc)
    return ApiError(
        500, "Switchyard failed; its log tells why.", type="server_error", code="internal"
    )


def status_error(response: HttpResponse, request: HttpRequest) -> ApiError:
    """A plain error response (Django's 405 from require_http_methods) as an ApiError."""
    if response.status_code == 405:
        return ApiError(
            405,
            f"{request.method} is not allowed here; use {response.get('Allow', 'another')}.",
            code="method_not_allowed",
        )
    reason = getattr(response, "reason_phrase", "") or "error"
    return ApiError(response.status_code, reason, code=reason.lower().replace(" ", "_"))


def json_errors(get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]):
    """Wrap the API's handler so that whatever fails answers in the OpenAI shape, whatever
    DEBUG says: an unknown path, a body too large, a 405, an unexpected exception."""

    async def respond(request: HttpRequest) -> HttpResponse:
        from .fields import storable  # fields imports this module

        try:
            for name, values in request.GET.lists():
                if not all(storable(text) for text in (name, *values)):
                    raise ApiError(
                        400,
                        "a query parameter has a NUL character or a lone surrogate",
                        param=name if storable(name) else None,
                        code="invalid_value",
                    )
            response = await get_response(request)
        except Exception as exc:
            return error_for(exc, request).as_json_response()
        is_json = response.get("Content-Type", "").startswith("application/json")
        if response.status_code >= 400 and not is_json:
            converted = status_error(response, request).as_json_response()
            if allow := response.get("Allow"):
                converted["Allow"] = allow
            return converted
        return response

    return respond
