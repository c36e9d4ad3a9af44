"""What the Files and Batch APIs answer, as OpenAI's do: for the OpenAPI schema."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

LIST_PARAMETERS = [
    OpenApiParameter("limit", int, description="1 to 100, default 20"),
    OpenApiParameter("after", str, description="the last id of the previous page"),
]


class FileOut(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(default="file")
    bytes = serializers.IntegerField()
    created_at = serializers.IntegerField(help_text="Unix seconds")
    filename = serializers.CharField()
    purpose = serializers.ChoiceField(choices=["batch", "batch_output"])
    status = serializers.CharField(default="processed")
    expires_at = serializers.IntegerField(allow_null=True)


class ListOut(serializers.Serializer):
    """OpenAI's list shape; each list adds its `data`."""

    object = serializers.CharField(default="list")
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class FileListOut(ListOut):
    data = FileOut(many=True)


class DeletedOut(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(default="file")
    deleted = serializers.BooleanField()


class CountsOut(serializers.Serializer):
    total = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="failed, expired or cancelled")


class BatchOut(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(default="batch")
    endpoint = serializers.CharField()
    errors = serializers.DictField(allow_null=True)
    input_file_id = serializers.CharField()
    completion_window = serializers.CharField()
    status = serializers.ChoiceField(
        choices=["in_progress", "completed", "expired", "cancelling", "cancelled"]
    )
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField()
    in_progress_at = serializers.IntegerField()
    expires_at = serializers.IntegerField()
    finalizing_at = serializers.IntegerField(allow_null=True)
    completed_at = serializers.IntegerField(allow_null=True)
    failed_at = serializers.IntegerField(allow_null=True)
    expired_at = serializers.IntegerField(allow_null=True)
    cancelling_at = serializers.IntegerField(allow_null=True)
    cancelled_at = serializers.IntegerField(allow_null=True)
    request_counts = CountsOut()
    metadata = serializers.DictField(allow_null=True)


class BatchListOut(ListOut):
    data = BatchOut(many=True)
