from django.urls import path

from . import views, watch

urlpatterns = [
    path("", views.index, name="dashboard"),
    path("dashboard/state.json", views.overview_json, name="dashboard-state"),
    path("dashboard/history.json", views.history_json, name="dashboard-history"),
    path("requests/<uuid:request_id>/", views.request_page, name="request-page"),
    path("requests/<uuid:request_id>/state.json", views.request_json, name="request-state"),
    # No login: the signed token is the key (dashboard/watch_tokens.py).
    path("watch/<str:token>/", watch.watch_page, name="watch-live"),
    path("watch/<str:token>/state.json", watch.watch_json, name="watch-live-state"),
]
