"""Ollama's listing calls: `GET /api/tags`, `/api/ps` and `/api/version`, `POST /api/show`
(served by Django, as the rest of the API; the calls that run a model are in
`ollama_api.py`). What they tell of a model is what Switchyard knows: its names, type,
capabilities and context length, and where it is loaded; nothing of its file."""

from django.db.models import Max
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from access import auth
from backends.models import Deployment, DeploymentState, Model

from . import model_list
from .errors import ApiError
from .inference import key_of, parse_json
from .ollama_api import VERSION, error_body, refuse

DETAILS = {"format": "", "family": "", "families": None, "parameter_size": ""}
TYPE_CAPABILITIES = {"llm": ["completion"], "embedding": ["embedding"], "reranking": []}
# Switchyard knows no architecture; Ollama's clients read `<architecture>.context_length`.
ARCHITECTURE = "switchyard"
MB = 1024 * 1024  # Ollama gives sizes in bytes


def capabilities(model: Model) -> list[str]:
    """Ollama's `capabilities` of a model: what its type does, then what it takes besides
    text, where known (`tools`, `vision`, `thinking`)."""
    return TYPE_CAPABILITIES.get(model.type, []) + list(model.capabilities or [])


def model_info(model: Model) -> dict:
    """Its context length, where the operator or a server has said it, under the keys
    Ollama's clients read."""
    if model.context_length is None:
        return {}
    return {
        "general.architecture": ARCHITECTURE,
        f"{ARCHITECTURE}.context_length": model.context_length,
    }


def ollama_error(error: ApiError) -> JsonResponse:
    return JsonResponse(error_body(error.body()), status=error.status, headers=error.headers())


@require_GET
async def tags(http: HttpRequest) -> HttpResponse:
    """`GET /api/tags`: the models the caller may use that some server has a deployment of,
    by name and alias, as `GET /v1/models` lists them; each with its largest known size
    (0: none known)."""
    try:
        api_key = await auth.acaller(key_of(http))
    except ApiError as error:
        return ollama_error(error)
    offered = await model_list.offered(api_key)
    known = Deployment.objects.filter(size_mb__isnull=False).values("model_id")
    sizes = {row["model_id"]: row["mb"] async for row in known.annotate(mb=Max("size_mb"))}
    return JsonResponse(
        {"models": [described(name, model, sizes.get(model.pk, 0) * MB) for name, model in offered]}
    )


@require_GET
async def ps(http: HttpRequest) -> HttpResponse:
    """`GET /api/ps`: the models loaded now on some server, that the caller may use."""
    try:
        api_key = await auth.acaller(key_of(http))
    except ApiError as error:
        return ollama_error(error)
    loaded = Deployment.objects.filter(state=DeploymentState.LOADED).select_related("model")
    found: dict[str, dict] = {}
    async for d in loaded.order_by("model__name"):
        if d.model.name not in found and model_list.may_use(api_key, d.model.names):
            size = (d.size_mb or 0) * MB
            running = {"expires_at": None, "size_vram": size}  # none: Switchyard decides
            if d.model.context_length is not None:
                running["context_length"] = d.model.context_length
            found[d.model.name] = {**described(d.model.name, d.model, size), **running}
    return JsonResponse({"models": list(found.values())})


@require_POST
async def show(http: HttpRequest) -> HttpResponse:
    """`POST /api/show` `{"model"}`: what a model can do (`capabilities`) and its context
    length where known (`model_info`), as retrieving it from `/v1/models` finds it."""
    try:
        api_key = await auth.acaller(key_of(http))
        body = parse_json(http.body)
        name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise refuse("model must be a model's name", "model")
        model = await model_list.deployed_model(api_key, name)
    except ApiError as error:
        return ollama_error(error)
    return JsonResponse(
        {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": DETAILS,
            "model_info": model_info(model),
            "capabilities": capabilities(model),
        }
    )


def described(name: str, model: Model, size: int = 0) -> dict:
    return {
        "name": name,
        "model": name,
        "modified_at": "1970-01-01T00:00:00Z",  # Switchyard knows no date for a model
        "size": size,
        "digest": "",
        "details": DETAILS,
        "type": model.type,
        "capabilities": capabilities(model),
    }


@require_GET
async def version(http: HttpRequest) -> HttpResponse:
    return JsonResponse({"version": VERSION})
