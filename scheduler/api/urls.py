from django.urls import path

from . import inference, jobs

# POST /v1/chat/completions, /v1/completions and /v1/embeddings: see openai_asgi.
urlpatterns = [
    path("v1/models", inference.list_models, name="models"),
    path("api/v1/requests", jobs.RequestList.as_view(), name="request-list"),
    path("api/v1/requests/<uuid:request_id>", jobs.request_detail, name="request-detail"),
]
