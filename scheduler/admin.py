from django.contrib import admin, messages

from .models import WAITING_STATES, Request, State, Trace, Worker
from .transitions import move


class TraceInline(admin.TabularInline):
    model = Trace
    extra = 0
    can_delete = False
    fields = ["at", "from_state", "to_state", "server", "reason"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Request)
class RequestAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "kind",
        "model_name",
        "priority",
        "state",
        "server",
        "created_at",
        "started_at",
        "finished_at",
        "attempts",
        "error_code",
    ]
    list_filter = ["state", "priority", "kind", "server"]
    search_fields = ["id", "model_name", "error"]
    date_hierarchy = "created_at"
    list_select_related = ["server"]
    inlines = [TraceInline]
    actions = ["cancel"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Cancel selected requests (those not yet processing)")
    def cancel(self, request, queryset):
        cancelled = sum(
            move(pk, WAITING_STATES, State.CANCELLED, f"cancelled in admin by {request.user}")
            for pk in queryset.values_list("pk", flat=True)
        )
        skipped = queryset.count() - cancelled
        self.message_user(
            request,
            f"Cancelled {cancelled} request(s)"
            + (f"; {skipped} were processing or finished and were left alone." if skipped else "."),
            messages.SUCCESS if cancelled else messages.WARNING,
        )


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["id", "host", "pid", "started_at", "last_heartbeat"]
    readonly_fields = ["host", "pid", "started_at", "last_heartbeat"]
