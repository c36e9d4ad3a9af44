from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/dashboard/", consumers.DashboardConsumer.as_asgi()),
    path("ws/requests/<uuid:request_id>/", consumers.RequestConsumer.as_asgi()),
    path("ws/watch/<str:token>/", consumers.WatchConsumer.as_asgi()),
]
