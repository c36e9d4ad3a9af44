from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import store
from .models import Batch, File


class ReadOnly(admin.ModelAdmin):
    """Made through the API only: the admin reads, and cancels."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(ReadOnly):
    list_display = [
        "id",
        "api_key",
        "endpoint",
        "status",
        "progress",
        "created_at",
        "ended_at",
    ]
    list_filter = ["status", "endpoint", "api_key"]
    search_fields = ["id", "input_file_id", "output_file_id"]
    readonly_fields = ["progress"]
    actions = ["cancel"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Batch]:
        return store.with_counts(super().get_queryset(request))

    def changelist_view(self, request: HttpRequest, extra_context=None):
        store.end_finished(Batch.objects.all())  # as the API would on reading them
        return super().changelist_view(request, extra_context)

    def change_view(self, request: HttpRequest, object_id, form_url="", extra_context=None):
        store.end_finished(Batch.objects.filter(pk=object_id))
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="completed / failed of total")
    def progress(self, batch: Batch) -> str:
        counts = store.counts(batch)
        return f"{counts['completed']} / {counts['failed']} of {counts['total']}"

    @admin.action(description="Cancel the selected batches (what runs stops at its server)")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        who = request.user.get_username()
        running = queryset.filter(status=Batch.Status.IN_PROGRESS)
        for batch in running:
            store.cancel(batch, f"cancelled with its batch {batch.id} in admin by {who}")
        self.message_user(request, f"Cancelled {len(running)} batch(es).", messages.SUCCESS)


@admin.register(File)
class FileAdmin(ReadOnly):
    list_display = ["id", "filename", "purpose", "bytes", "api_key", "created_at"]
    list_filter = ["purpose", "api_key"]
    search_fields = ["id", "filename"]
    exclude = ["content"]  # may be large; read it with GET /v1/files/{id}/content
