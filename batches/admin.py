from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import store
from .models import Batch, BatchItem, File


class ReadOnly(admin.ModelAdmin):
    """Made through the API only: the admin reads, and cancels."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class BatchItemInline(admin.TabularInline):
    model = BatchItem
    fields = ["line", "custom_id", "request", "state"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    @admin.display(description="state")
    def state(self, item: BatchItem) -> str:
        return item.request.state if item.request else "purged"


@admin.register(Batch)
class BatchAdmin(ReadOnly):
    list_display = [
        "id",
        "api_key",
        "endpoint",
        "shown_status",
        "progress",
        "created_at",
        "ended_at",
    ]
    list_filter = ["status", "endpoint", "api_key"]
    search_fields = ["id", "input_file_id", "output_file_id"]
    inlines = [BatchItemInline]
    actions = ["cancel"]

    @admin.display(description="status", ordering="status")
    def shown_status(self, batch: Batch) -> str:
        return store.refreshed(batch).get_status_display()

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
