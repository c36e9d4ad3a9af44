from django.urls import path

from . import inference, jobs

urlpatterns = [
    path("v1/chat/completions", inference.chat_completions, name="chat-completions"),
    path("v1/completions", inference.completions, name="completions"),
    path("v1/embeddings", inference.embeddings, name="embeddings"),
    path("v1/models", inference.list_models, name="models"),
    path("api/v1/requests", jobs.RequestList.as_view(), name="request-list"),
    path("api/v1/requests/<uuid:request_id>", jobs.request_detail, name="request-detail"),
]
