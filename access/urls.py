from django.urls import path

from . import watch

urlpatterns = [
    # The JSON first: the page's pattern would take a token ending in ".json" as its own.
    path("watch/<str:token>.json", watch.watch_json, name="watch-json"),
    path("watch/<str:token>", watch.watch_page, name="watch"),
]
