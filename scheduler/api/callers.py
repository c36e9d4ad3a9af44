"""Who is calling, for the API views that care: the operator API and the list of one's own
requests. The API skips the site's middleware (config.asgi), so a staff session is read
here from its cookie, and a session's unsafe calls must carry its CSRF token, as DRF's own
session authentication demands. A call with an `Authorization` header is a key's call: its
session cookie, if any, is not read (nor its CSRF token asked for)."""

from dataclasses import dataclass
from functools import wraps
from importlib import import_module

from django.conf import settings
from django.contrib import auth as sessions
from django.db.models import QuerySet
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request as DrfRequest

from access import auth
from access.models import ApiKey

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
            http.user = sessions.get_user(http)
        return super().authenticate(request)

    def authenticate_header(self, request: DrfRequest) -> str:
        return 'Session realm="switchyard"'  # a 401, not a 403, for a caller with no login


class StaffSessionScheme(OpenApiAuthenticationExtension):
    """How the schema names StaffSession."""

    target_class = StaffSession
    name = "staffSession"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME}


def key_caller(api_key: ApiKey) -> Caller:
    return Caller(name=f"key {api_key}", operator=api_key.operator, staff=False)


def caller_of(request: DrfRequest) -> Caller | None:
    """The caller: a key's if the call carries one (401 if it is not good), else as the
    view's session authentication found it, or None if anonymous."""
    if request._request.headers.get("Authorization"):
        return key_caller(auth.verified(request._request.headers["Authorization"]))
    user = request.user
    if user is not None and user.is_authenticated and user.is_active:
        return Caller(
            name=f"user {user.get_username()}", operator=user.is_staff, staff=user.is_staff
        )
    return None


# What `operator_of` answers, for each operator endpoint's schema.
OPERATOR_REFUSALS = {
    401: OpenApiResponse(description="No staff login nor operator key, or a bad key"),
    403: OpenApiResponse(description="Not an operator, or a session's CSRF token missing"),
}


def operator_of(request: DrfRequest) -> Caller:
    """The caller, if it may use the operator API: else 401 (no login) or 403."""
    caller = caller_of(request)
    if caller is None:
        raise ApiError(
            401,
            "The operator API needs a staff login or an operator key"
            " (`Authorization: Bearer <key>`).",
            type="authentication_error",
            code="unauthorized",
        )
    if not caller.operator:
        raise ApiError(
            403,
            "Only staff (or a key with the operator flag) may do this.",
            code="permission_denied",
        )
    return caller


def may_read_the_schema(http) -> None:
    """/api/schema/ and /api/docs/ (behind the site's middleware: its session is read): with
    SWITCHYARD_AUTH=required, for a good key or a staff login; else 401 invalid_api_key."""
    if not auth.required():
        return
    if http.headers.get("Authorization"):
        auth.verified(http.headers["Authorization"])
        return
    user = getattr(http, "user", None)
    if not (user and user.is_active and user.is_staff):
        raise auth.invalid_api_key()


def schema_view(view):
    """The schema's view (or its docs page's), for those `may_read_the_schema` lets in."""

    @wraps(view)
    def guarded(http, *args, **kwargs):
        try:
            may_read_the_schema(http)
        except ApiError as error:
            refused = error.as_json_response()
            refused["WWW-Authenticate"] = 'Bearer realm="switchyard"'
            return refused
        return view(http, *args, **kwargs)

    return guarded


def own_requests(api_key) -> QuerySet:
    """The requests the caller may list: its key's own; every request with auth off
    (`SWITCHYARD_AUTH=off`, no key)."""
    found = Request.objects.all()
    return found if api_key is None else found.filter(api_key=api_key)
