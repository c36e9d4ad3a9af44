"""HTTP through Django, websockets through the dashboard's consumers (staff sessions only).

The inference endpoints are a bare ASGI app (`scheduler.api.openai_asgi`); the rest of the
API skips the site's middleware (see `ApiHandler`); everything else, admin and dashboard
included, gets all of it."""

import os

from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

# urls: imported now, not during the first request
from config import daphne_requests, urls  # noqa: E402, F401
from dashboard.routing import websocket_urlpatterns  # noqa: E402
from scheduler import health  # noqa: E402
from scheduler.api import gate, ollama_api, openai_asgi, web_stop  # noqa: E402
from scheduler.api.errors import json_errors  # noqa: E402
from scheduler.api.inference import Reply  # noqa: E402

API_PREFIXES = ("/v1/", "/api/v1/")
daphne_requests.install()


class ApiHandler(ASGIHandler):
    """Django without middleware, for the API. Sessions, CSRF, logins, messages, static
    files and frame options do not apply to it, and under ASGI every one of them is a sync
    middleware: each request would cross to a thread and back about a dozen times."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        # Every failure answers in the OpenAI shape, whatever DEBUG says.
        self._middleware_chain = json_errors(self._get_response_async)


api_asgi_app = ApiHandler()


async def http(scope, receive, send) -> None:
    path = scope["path"]
    if path in openai_asgi.KINDS or path in ollama_api.PATHS:
        app = openai_asgi.app
    elif path.startswith(API_PREFIXES) or path in health.PATHS or path in ollama_api.LISTING:
        app = api_asgi_app
    else:
        app = django_asgi_app
    if app is not django_asgi_app:
        if web_stop.draining():  # a new call on a connection kept open: not taken
            refused = Reply.error(web_stop.not_taken())
            refused.headers["Connection"] = "close"
            await openai_asgi.send_reply(send, refused)
            return
        if (refused := gate.refusal(scope)) is not None:
            # What the site's middleware checks (Host, cross-site posts), for the paths
            # without it.
            await openai_asgi.send_reply(send, Reply.error(refused))
            return
    await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
