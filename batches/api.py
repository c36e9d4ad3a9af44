"""OpenAI's Files and Batch APIs, for batches: `/v1/files` and `/v1/batches`, as the OpenAI
clients call them. A caller sees only its own files and batches."""

from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from access import auth
from access.models import ApiKey
from scheduler.api.errors import ApiError
from scheduler.api.fields import check_text
from scheduler.api.openai_asgi import KINDS

from . import lines, store
from .models import Batch, File
from .schema import LIST_PARAMETERS, BatchListOut, BatchOut, DeletedOut, FileListOut, FileOut


def unix(moment) -> int | None:
    return int(moment.timestamp()) if moment else None


def file_object(f: File) -> dict:
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": unix(f.created_at),
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "expires_at": None,
    }


def batch_object(b: Batch) -> dict:
    ended = b.ended_at if b.status != Batch.Status.IN_PROGRESS else None
    return {
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": None,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id or None,
        "error_file_id": b.error_file_id or None,
        "created_at": unix(b.created_at),
        "in_progress_at": unix(b.created_at),
        "expires_at": unix(b.expires_at),
        "finalizing_at": unix(ended),
        "completed_at": unix(ended) if b.status == Batch.Status.COMPLETED else None,
        "failed_at": None,
        "expired_at": unix(ended) if b.status == Batch.Status.EXPIRED else None,
        "cancelling_at": unix(b.cancelling_at),
        "cancelled_at": unix(ended) if b.status == Batch.Status.CANCELLED else None,
        "request_counts": store.counts(b),
        "metadata": b.metadata,
    }


def own(rows: QuerySet, api_key: ApiKey | None) -> QuerySet:
    return rows if api_key is None else rows.filter(api_key=api_key)


def one(rows: QuerySet, pk: str, api_key: ApiKey | None, what: str):
    """The caller's own row `pk`: another key's answers exactly as an unknown id."""
    found = own(rows, api_key).filter(pk=pk).first()
    if found is None:
        raise ApiError(404, f"No {what} with id {pk}.", code=f"{what}_not_found")
    return found


def page(rows: QuerySet, params, shown) -> dict:
    """OpenAI's list shape: newest first, `limit` (1 to 100, default 20) after the id
    `after`."""
    try:
        limit = int(params.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit must be from 1 to 100.", param="limit", code="invalid_value")
    if after := params.get("after"):
        mark = rows.filter(pk=after).values_list("created_at", "id").first()
        if mark is None:
            raise ApiError(
                400, f"No such id to list after: {after}.", param="after", code="invalid_value"
            )
        rows = rows.filter(created_at__lte=mark[0]).exclude(created_at=mark[0], id__gte=mark[1])
    found = list(rows[: limit + 1])
    data = [shown(row) for row in found[:limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(found) > limit,
    }


class UploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="JSONL: one request a line.")
    purpose = serializers.ChoiceField(choices=["batch"])


class FileList(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        operation_id="files_list",
        tags=["batches"],
        parameters=[*LIST_PARAMETERS, OpenApiParameter("purpose", str)],
        responses={200: FileListOut},
    )
    def get(self, http):
        api_key = auth.caller(http.headers.get("Authorization"))
        rows = own(File.objects.all(), api_key)
        if purpose := http.query_params.get("purpose"):
            rows = rows.filter(purpose=purpose)
        return Response(page(rows, http.query_params, file_object))

    @extend_schema(
        operation_id="files_create",
        tags=["batches"],
        request={"multipart/form-data": UploadSerializer},
        responses={200: FileOut},
    )
    def post(self, http):
        api_key = auth.caller(http.headers.get("Authorization"))
        upload = UploadSerializer(data=http.data)
        upload.is_valid(raise_exception=True)
        sent = upload.validated_data["file"]
        most = settings.SWITCHYARD["MAX_FILE_MB"] * 1024 * 1024
        if sent.size > most:
            raise ApiError(
                413,
                f"A file may hold at most {most} bytes (SWITCHYARD_MAX_FILE_MB).",
                code="file_too_large",
            )
        try:
            content = sent.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(
                400, "The file is not UTF-8 text.", param="file", code="invalid_file"
            ) from None
        check_text(content)
        made = File.objects.create(
            api_key=api_key,
            purpose=File.Purpose.BATCH,
            filename=(sent.name or "upload.jsonl")[:255],
            content=content,
            bytes=sent.size,
        )
        return Response(file_object(made))


@extend_schema(methods=["GET"], operation_id="files_retrieve", tags=["batches"], responses=FileOut)
@extend_schema(
    methods=["DELETE"], operation_id="files_delete", tags=["batches"], responses=DeletedOut
)
@api_view(["GET", "DELETE"])
def file_detail(http, file_id: str):
    api_key = auth.caller(http.headers.get("Authorization"))
    found = one(File.objects.all(), file_id, api_key, "file")
    if http.method == "DELETE":
        found.delete()
        return Response({"id": file_id, "object": "file", "deleted": True})
    return Response(file_object(found))


@require_GET
def file_content(http, file_id: str):
    """Plain Django, not DRF: the OpenAI clients ask for `application/binary`, which DRF's
    content negotiation would refuse."""
    api_key = auth.caller(http.headers.get("Authorization"))
    found = one(File.objects.all(), file_id, api_key, "file")
    answer = HttpResponse(found.content.encode(), content_type="application/octet-stream")
    # A download, never a page of this origin: whoever uploaded it chose its bytes.
    answer["Content-Disposition"] = f'attachment; filename="{found.id}.jsonl"'
    answer["X-Content-Type-Options"] = "nosniff"
    return answer


class CreateSerializer(serializers.Serializer):
    input_file_id = serializers.CharField()
    endpoint = serializers.ChoiceField(choices=sorted(KINDS))
    completion_window = serializers.ChoiceField(choices=["24h"])
    metadata = serializers.DictField(child=serializers.CharField(), required=False, allow_null=True)


class BatchList(APIView):
    @extend_schema(
        operation_id="batches_list",
        tags=["batches"],
        parameters=LIST_PARAMETERS,
        responses={200: BatchListOut},
    )
    def get(self, http):
        api_key = auth.caller(http.headers.get("Authorization"))
        rows = own(Batch.objects.all(), api_key)
        store.end_finished(rows)
        return Response(page(store.with_counts(rows), http.query_params, batch_object))

    @extend_schema(
        operation_id="batches_create",
        tags=["batches"],
        request=CreateSerializer,
        responses={200: BatchOut},
    )
    def post(self, http):
        api_key = auth.caller(http.headers.get("Authorization"))
        asked = CreateSerializer(data=http.data)
        asked.is_valid(raise_exception=True)
        data = asked.validated_data
        source = one(File.objects.all(), data["input_file_id"], api_key, "file")
        if source.purpose != File.Purpose.BATCH:
            raise lines.bad_file(
                f"The file {source.id} is not a batch's input (its purpose is {source.purpose})."
            )
        endpoint, kind = data["endpoint"], KINDS[data["endpoint"]]
        most = settings.SWITCHYARD["BATCH_MAX_REQUESTS"]
        found = lines.parse(source.content, kind, endpoint, api_key, most)
        made = store.create(api_key, kind, endpoint, source, found, data.get("metadata"))
        return Response(batch_object(read(made.pk, api_key)))


@extend_schema(operation_id="batches_retrieve", tags=["batches"], responses=BatchOut)
@api_view(["GET"])
def batch_detail(http, batch_id: str):
    api_key = auth.caller(http.headers.get("Authorization"))
    return Response(batch_object(read(batch_id, api_key)))


def read(batch_id: str, api_key: ApiKey | None) -> Batch:
    """The caller's batch, ended first if its last request has, with its counts."""
    rows = own(Batch.objects.filter(pk=batch_id), api_key)
    store.end_finished(rows)
    return one(store.with_counts(rows), batch_id, api_key, "batch")


@extend_schema(operation_id="batches_cancel", tags=["batches"], request=None, responses=BatchOut)
@api_view(["POST"])
def batch_cancel(http, batch_id: str):
    """Cancels what still waits or runs (a request at its server stops there); the batch is
    `cancelling` until its last request has ended, then `cancelled`, with the answers it
    had."""
    api_key = auth.caller(http.headers.get("Authorization"))
    found = read(batch_id, api_key)
    if found.status == Batch.Status.IN_PROGRESS:
        store.cancel(found, f"cancelled with its batch {found.id}")
    return Response(batch_object(read(batch_id, api_key)))
