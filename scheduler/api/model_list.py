"""`GET /v1/models` and `GET /v1/models/{name}`: the models a caller may ask for, by name and
alias, in OpenAI's shape, or in Anthropic's for Anthropic's clients (which send
`anthropic-version` on every call)."""

from django.db.models import Exists, OuterRef
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from access import auth
from access.limits import check_model
from backends.models import Deployment, DeploymentState, Model, ModelType

from ..pool_threads import in_pool_thread
from . import intake
from .errors import ApiError
from .inference import key_of

EPOCH = "1970-01-01T00:00:00Z"  # Anthropic's `created_at`: Switchyard knows no release date


@require_GET
async def list_models(http: HttpRequest) -> HttpResponse:
    """The models the caller may use (all, for a key with no list of models) that some
    server has a deployment of: a model no server serves is refused, so it is not offered.
    Anthropic's clients are shown the LLMs only (all that a message can ask)."""
    try:
        api_key = await auth.acaller(key_of(http))
    except ApiError as error:
        return error.as_json_response()
    anthropic = for_anthropic(http)
    data = [
        model_object(name, model, anthropic)
        for name, model in await offered(api_key, llm_only=anthropic)
    ]
    if anthropic:
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return JsonResponse({"data": data, "has_more": False, "first_id": first, "last_id": last})
    return JsonResponse({"object": "list", "data": data})


async def offered(api_key, llm_only: bool = False) -> list[tuple[str, Model]]:
    """Each name and alias, with its model, of the models the key may use (all, for a key
    with no list of models) that some server has a deployment of, by name."""
    served = (
        Model.objects.filter(deployments__isnull=False)
        .distinct()
        .order_by("name")
        .annotate(loaded=loaded_somewhere())
    )
    if llm_only:
        served = served.filter(type=ModelType.LLM)
    found = []
    async for model in served:
        if may_use(api_key, model.names):
            found += [(name, model) for name in model.names]
    return found


@require_GET
async def retrieve_model(http: HttpRequest, name: str) -> HttpResponse:
    """One model, by name or alias, as `GET /v1/models` lists it. As for a request: 403
    `model_not_allowed` for a model the key may not use (whether or not it exists), else
    404 `model_not_found` for one that does not exist, and 404 `model_not_deployed` for one
    no server has a deployment of (which `GET /v1/models` does not list)."""
    try:
        api_key = await auth.acaller(key_of(http))
        model = await deployed_model(api_key, name)
    except ApiError as error:
        return error.as_json_response()
    return JsonResponse(model_object(name, model, for_anthropic(http)))


async def deployed_model(api_key, name: str) -> Model:
    """The model `name` (or alias) names, if the key may use it and a server has it."""
    await in_pool_thread(check_model)(api_key, name, intake.names_of)
    model = await in_pool_thread(intake.find_model)(name)
    if model is None:
        raise intake.model_not_found(name)
    if not await model.deployments.aexists():
        raise ApiError(
            404, f"no server has a deployment of {model.name}", code="model_not_deployed"
        )
    model.loaded = await model.deployments.filter(state=DeploymentState.LOADED).aexists()
    return model


def loaded_somewhere() -> Exists:
    """Whether some server holds the model loaded now, as `/api/ps` lists it."""
    return Exists(Deployment.objects.filter(model_id=OuterRef("pk"), state=DeploymentState.LOADED))


def for_anthropic(http: HttpRequest) -> bool:
    return "anthropic-version" in http.headers


def may_use(api_key, names: list[str]) -> bool:
    """A key may use a model if it may use one of its names (any key, with keys off)."""
    return api_key is None or any(api_key.allows_model(n) for n in names)


def model_object(name: str, model: Model, anthropic: bool = False) -> dict:
    """A model as OpenAI's API shows one, with its type (llm, embedding, reranking), where
    known what it takes besides text and its context length, and whether a server holds it
    loaded now (`model.loaded`, read with it); or as Anthropic's does."""
    if anthropic:
        return {"type": "model", "id": name, "display_name": name, "created_at": EPOCH}
    shown = {"id": name, "object": "model", "created": 0, "owned_by": "switchyard"}
    known = {"capabilities": model.capabilities, "context_length": model.context_length}
    known = {k: v for k, v in known.items() if v is not None}
    return {**shown, "type": model.type, **known, "loaded": model.loaded}
