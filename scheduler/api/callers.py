"""Who is calling, for the API views that care: the operator API and the list of one's own
requests. The API skips the site's middleware (config.asgi), so a staff session is read
here from its cookie, and a session's unsafe calls must carry its CSRF token, as DRF's own
session authentication demands."""

from dataclasses import dataclass
from importlib import import_module

from django.conf import settings
from django.contrib import auth
from django.db.models import QuerySet
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request as DrfRequest

from ..models import Request
from .errors import ApiError


@dataclass(frozen=True)
class Caller:
    name: str  # for the trace: who asked
    operator: bool  # may use the operator API
    staff: bool


class StaffSession(SessionAuthentication):
    """DRF's session authentication (with its CSRF check) for views that run without
    Django's session and authentication middleware."""

    def authenticate(self, request: DrfRequest):
        http = request._request
        if not hasattr(http, "user"):
            store = import_module(settings.SESSION_ENGINE).SessionStore
            http.session = store(http.COOKIES.get(settings.SESSION_COOKIE_NAME))
            http.user = auth.get_user(http)
        return super().authenticate(request)

    def authenticate_header(self, request: DrfRequest) -> str:
        return 'Session realm="switchyard"'  # a 401, not a 403, for a caller with no login


class StaffSessionScheme(OpenApiAuthenticationExtension):
    """How the schema names StaffSession."""

    target_class = StaffSession
    name = "staffSession"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME}


def caller_of(request: DrfRequest) -> Caller | None:
    """The caller as the view's authentication found it, or None if anonymous."""
    user = request.user
    if user is not None and user.is_authenticated and user.is_active:
        return Caller(
            name=f"user {user.get_username()}", operator=user.is_staff, staff=user.is_staff
        )
    return None


def operator_of(request: DrfRequest) -> Caller:
    """The caller, if it may use the operator API: else 401 (no login) or 403."""
    caller = caller_of(request)
    if caller is None:
        raise ApiError(
            401,
            "The operator API needs a staff login (or an operator key).",
            type="authentication_error",
            code="unauthorized",
        )
    if not caller.operator:
        raise ApiError(
            403, "Only staff (or an operator key) may do this.", code="permission_denied"
        )
    return caller


def own_requests(api_key) -> QuerySet:
    """The requests the caller may list: its key's own; every request with auth off
    (`SWITCHYARD_AUTH=off`, no key)."""
    found = Request.objects.all()
    return found if api_key is None else found.filter(api_key=api_key)
