from django.urls import path

from . import (
    config,
    intents,
    jobs,
    keys,
    model_list,
    ollama_listing,
    own_key,
    queue,
    servers,
    usage,
)

# POST /v1/chat/completions, /v1/completions and /v1/embeddings: see openai_asgi.
urlpatterns = [
    path("v1/models", model_list.list_models, name="models"),
    # Model names may hold slashes and colons (org/model, qwen3:8b).
    path("v1/models/<path:name>", model_list.retrieve_model, name="model"),
    path("api/tags", ollama_listing.tags, name="ollama-tags"),
    path("api/ps", ollama_listing.ps, name="ollama-ps"),
    path("api/show", ollama_listing.show, name="ollama-show"),
    path("api/version", ollama_listing.version, name="ollama-version"),
    path("api/v1/requests", jobs.RequestList.as_view(), name="request-list"),
    path("api/v1/requests/<uuid:request_id>", jobs.request_detail, name="request-detail"),
    path("api/v1/queue", queue.Queue.as_view(), name="queue"),
    path("api/v1/queue/cancel", queue.CancelQueued.as_view(), name="queue-cancel"),
    path("api/v1/servers", servers.ServerList.as_view(), name="server-list"),
    path("api/v1/servers/<slug:name>", servers.ServerDetail.as_view(), name="server-detail"),
    path("api/v1/servers/<slug:name>/load", servers.LoadServer.as_view(), name="server-load"),
    path("api/v1/servers/<slug:name>/unload", servers.UnloadServer.as_view()),
    path("api/v1/servers/<slug:name>/drain", servers.DrainServer.as_view()),
    path("api/v1/servers/<slug:name>/enable", servers.EnableServer.as_view()),
    path("api/v1/servers/<slug:name>/sync", servers.SyncServer.as_view()),
    path("api/v1/servers/<slug:name>/check", servers.CheckServer.as_view()),
    path("api/v1/intents", intents.IntentList.as_view(), name="intent-list"),
    path("api/v1/intents/<int:intent_id>", intents.intent_detail, name="intent-detail"),
    path("api/v1/config", config.Config.as_view(), name="config"),
    path("api/v1/key", own_key.OwnKey.as_view(), name="own-key"),
    path("api/v1/keys", keys.KeyList.as_view(), name="key-list"),
    path("api/v1/keys/<str:prefix>", keys.KeyDetail.as_view(), name="key-detail"),
    path(
        "api/v1/keys/<str:prefix>/rotate-webhook-secret",
        keys.RotateWebhookSecret.as_view(),
        name="key-rotate-webhook-secret",
    ),
    path("api/v1/teams", keys.TeamList.as_view(), name="team-list"),
    path("api/v1/usage", usage.Usage.as_view(), name="usage"),
    path("api/v1/teams/<str:name>", keys.TeamDetail.as_view(), name="team-detail"),
]
