"""Watch URLs: a signed, unguessable link to one request's page, without a login.

The token is the request's id signed with SECRET_KEY (HMAC-SHA256, salted for this use:
`dashboard/watch_tokens.py`): a link can be shared, and nobody can make one for a request
they were not given. There is one watch page, the live one (`dashboard/watch.py`,
`/watch/<token>/`): place, ETA, why it waits, load progress, trace and the answer, never the
prompt. The first links handed out (`/watch/<token>`, without the slash) lead to it, and
`/watch/<token>.json` answers what it shows."""

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from dashboard import watch
from dashboard.watch_tokens import request_id_for, token_for

__all__ = ["token_for", "watch_url"]


def watch_url(request_id) -> str:
    """The page's path (as `reverse("watch-live", ...)` gives it, without the resolver's
    cost: every inference answer carries one)."""
    return f"/watch/{token_for(request_id)}/"


@require_GET
def watch_page(http: HttpRequest, token: str) -> HttpResponse:
    if request_id_for(token) is None:
        raise Http404("no such watch link")
    return redirect("watch-live", token=token)


@require_GET
def watch_json(http: HttpRequest, token: str) -> JsonResponse:
    return JsonResponse(watch.state_for_token(token))
