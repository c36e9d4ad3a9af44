"""Staff pages. Each renders the current state into the page, then the browser follows it
over a websocket; the JSON views let a page that missed a message re-read the truth."""

from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from . import charts, state


def detail_or_404(request_id) -> dict:
    detail = state.request_detail(request_id)
    if detail is None:
        raise Http404("no such request")
    return detail


@staff_member_required
def index(request):
    return render(request, "dashboard/index.html", {"initial": state.overview()})


@staff_member_required
def request_page(request, request_id):
    detail = detail_or_404(request_id)
    return render(request, "dashboard/request.html", {"initial": detail, "id": request_id})


@staff_member_required
def overview_json(request):
    return JsonResponse(state.overview())


@staff_member_required
def request_json(request, request_id):
    return JsonResponse(detail_or_404(request_id))


@staff_member_required
def history_json(request):
    """The charts' figures for the last hour (or `?range=6h` / `24h`)."""
    key = request.GET.get("range", "1h")
    if key not in charts.RANGES:
        return JsonResponse(
            {
                "error": {
                    "message": f"range must be one of {', '.join(charts.RANGES)}",
                    "type": "invalid_request_error",
                    "param": "range",
                    "code": "invalid_range",
                }
            },
            status=400,
        )
    return JsonResponse(charts.history(key, timezone.now()))
