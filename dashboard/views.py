from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, JsonResponse
from django.shortcuts import render

from . import state


@staff_member_required
def index(request):
    return render(request, "dashboard/index.html", {"initial": state.overview()})


@staff_member_required
def request_page(request, request_id):
    detail = state.request_detail(request_id)
    if detail is None:
        raise Http404("no such request")
    return render(request, "dashboard/request.html", {"initial": detail, "id": request_id})


@staff_member_required
def overview_json(request):
    return JsonResponse(state.overview())
