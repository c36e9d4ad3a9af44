"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

from django.http import JsonResponse
from rest_framework.exceptions import APIException, NotFound, ParseError, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

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
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else {}

    def as_json_response(self) -> JsonResponse:
        return JsonResponse(self.body(), status=self.status, headers=self.headers())

    def as_drf_response(self) -> Response:
        return Response(self.body(), status=self.status, headers=self.headers())


def openai_exception_handler(exc, context) -> Response | None:
    if isinstance(exc, ApiError):
        return exc.as_drf_response()
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
    code = {ParseError: "invalid_json", NotFound: "not_found"}.get(type(exc), exc.default_code)
    error = ApiError(response.status_code, message, param=param, code=code)
    return Response(error.body(), status=response.status_code)
