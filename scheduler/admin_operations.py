"""Admin pages for what the operator surface writes: intents and job callbacks (read-only:
intents are made through the operator API, callbacks by the jobs API)."""

from django.contrib import admin

from .admin import ReadOnlyAdmin
from .models import Callback, Intent, IntentTrace


class IntentTraceInline(admin.TabularInline):
    model = IntentTrace
    extra = 0
    can_delete = False
    fields = ["at", "status", "reason"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Intent)
class IntentAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "action",
        "server",
        "deployment",
        "status",
        "requested_by",
        "created_at",
        "outcome",
    ]
    list_filter = ["status", "action", "server"]
    search_fields = ["requested_by", "outcome"]
    list_select_related = ["server", "deployment__model", "deployment__server"]
    ordering = ["-id"]
    inlines = [IntentTraceInline]


@admin.register(Callback)
class CallbackAdmin(ReadOnlyAdmin):
    list_display = ["request_id", "status", "attempts", "next_at", "last_error"]
    list_filter = ["status"]
    search_fields = ["request__id", "last_error"]
    ordering = ["-next_at"]
