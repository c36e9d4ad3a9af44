"""Tiny builders for database rows used across tests."""

from datetime import timedelta

from django.utils import timezone

from backends.models import Deployment, Model, Server
from scheduler.models import Priority, Request


def server(name: str = "gpu-1", kind: str = "simulated", **fields) -> Server:
    fields.setdefault("health", "up")
    return Server.objects.create(name=name, kind=kind, **fields)


def model(name: str, **fields) -> Model:
    return Model.objects.get_or_create(name=name, defaults=fields)[0]


def deployment(srv: Server, model_name: str, load_s: float = 0.01, **fields) -> Deployment:
    # The simulated server's own options; other kinds take other options, if any.
    simulated = srv.kind == "simulated"
    options = {"load_seconds": load_s, "tokens_per_second": 10_000} if simulated else {}
    options.update(fields.pop("load_options", {}))
    fields.setdefault("server_model_id", model_name)
    return Deployment.objects.create(
        server=srv,
        model=model(model_name),
        load_options=options,
        **fields,
    )


def request(model_name: str, priority: int = Priority.NORMAL, **fields) -> Request:
    now = timezone.now()
    return Request.objects.create(
        kind=fields.pop("kind", "chat"),
        model_name=model_name,
        model=model(model_name),
        payload=fields.pop(
            "payload",
            {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
        priority=priority,
        expires_at=now + timedelta(seconds=600),
        **fields,
    )
