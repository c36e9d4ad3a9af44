import json

from django.contrib import admin, messages
from django.db.models import Count, Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator

from backends.admin import in_seconds, server_label, to_the_ms
from dashboard.state import caller as caller_of
from dashboard.state import shown_answer

from .models import Request, State, Trace, Worker
from .reasons_shown import reported_fraction, shown
from .store.completion import cancel_requests

WHY_CHARS = 120  # an error's first line or so; the whole of it is on the request's page


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by Switchyard itself: operators look, they do not edit."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.display(description="at", ordering="at")
def at_ms(trace: Trace) -> str:
    return to_the_ms(trace.at)


class TraceInline(admin.TabularInline):
    model = Trace
    extra = 0
    can_delete = False
    fields = [at_ms, "from_state", "to_state", "server", "reason"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Request)
class RequestAdmin(ReadOnlyAdmin):
    # Short enough for a 1,280 px screen beside the filters: the full id, the kind and the
    # start and end times are on the request's own page. `why` says why a waiting request
    # waits, or how an ended one failed.
    list_display = [
        "short_id",
        "model_name",
        "priority",
        "state",
        "why",
        "caller",
        "server_column",
        "created",
        "waited",
        "took",
        "attempts",
    ]
    readonly_fields = ["why", "conversation", "body", "answer"]
    # The request's own page: what was asked, where it is, when, then the bodies. Its stored
    # reason is shown as `why` (live, as the pages say it), not as the policy's JSON.
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("kind", "model_name", "model"),
                    ("priority", "stream", "in_batch"),
                    "api_key",
                    "callback_url",
                ]
            },
        ),
        (
            "Where it is",
            {
                "fields": [
                    "state",
                    "why",
                    ("server", "deployment", "worker"),
                    ("conversation", "cache_server"),
                    ("attempts", "not_before"),
                    ("error_code", "error"),
                ]
            },
        ),
        (
            "When",
            {
                "fields": [
                    ("created_at", "routed_at", "ready_at"),
                    ("started_at", "finished_at"),
                    ("expires_at", "no_server_grace_s"),
                ]
            },
        ),
        ("Body and answer", {"fields": ["body", "answer"]}),
    ]
    list_filter = [
        "state",
        "priority",
        "kind",
        "server",
        "api_key",
        "api_key__team",
        "stream",
        "in_batch",
    ]
    search_fields = ["id", "model_name", "error", "^affinity_key"]  # a conversation's turns
    date_hierarchy = "created_at"
    # Newest first, by the index of arrival: the model's own order (class, then arrival)
    # has no index over finished requests, and sorted the whole table on every page.
    ordering = ["-created_at"]
    show_full_result_count = False  # a filtered page counts its rows, not the table's too
    list_select_related = ["server", "deployment", "api_key__team"]
    inlines = [TraceInline]
    actions = ["cancel"]

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: Request) -> str:
        return str(obj.pk)[:8]

    @admin.display(description="caller", ordering="api_key__name")
    def caller(self, obj: Request) -> str:
        """The key's name, and its team's: its prefix is on the request's own page."""
        return caller_of(obj) or "-"

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Request) -> str:
        return timezone.localtime(obj.created_at).strftime("%b %d %H:%M:%S")

    @admin.display(description="waited")
    def waited(self, obj: Request) -> str:
        """In line so far while it waits, as the dashboard counts it."""
        return in_seconds(obj.waited_s(timezone.now()))

    @admin.display(description="took")
    def took(self, obj: Request) -> str:
        if not (obj.started_at and obj.finished_at):
            return "-"
        return in_seconds((obj.finished_at - obj.started_at).total_seconds())

    @admin.display(description="server", ordering="server__name")
    def server_column(self, obj: Request) -> str:
        return server_label(obj.server)

    @admin.display(description="why")
    def why(self, obj: Request) -> str:
        """A waiting request's reason as the pages show it (`reasons_shown`); for one that
        failed or expired, its error code and message."""
        reason = shown(obj.reason, obj.state, timezone.now(), reported=reported_fraction(obj))
        if reason is not None:
            return reason["text"]
        if obj.error_code:
            return Truncator(f"{obj.error_code}: {obj.error}").chars(WHY_CHARS)
        return "-"

    @admin.display(description="conversation")
    def conversation(self, obj: Request) -> str:
        """Its conversation's key, short, as a link to every turn of it."""
        if not obj.affinity_key:
            return "-"
        turns = reverse("admin:scheduler_request_changelist")
        query = urlencode({"q": obj.affinity_key})
        short = obj.affinity_key[:8]
        return format_html('<a href="{}?{}">{}… (its turns)</a>', turns, query, short)

    @admin.display(description="body")
    def body(self, obj: Request) -> str:
        """What the app sent, as indented JSON, in a box that scrolls: a long prompt does
        not push the rest of the page away."""
        return format_html('<pre class="sy-body" tabindex="0">{}</pre>', as_json(obj.payload))

    @admin.display(description="answer")
    def answer(self, obj: Request) -> str:
        """Its text and the tools it calls, as the dashboard shows them; the whole answer as
        stored (usage, timings, ids) folded beneath."""
        if obj.result is None:
            return "-"
        return format_html(
            '<div class="sy-answer" tabindex="0">{}</div><details><summary>The answer as stored'
            ' (JSON)</summary><pre class="sy-body" tabindex="0">{}</pre></details>',
            shown_answer(obj.result) or "(no text)",
            as_json(obj.result),
        )

    @admin.action(description="Cancel selected requests (stopping those at their servers)")
    def cancel(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        cancelled = cancel_requests(ids, f"cancelled in admin by {request.user}")
        skipped = len(ids) - cancelled
        if cancelled:
            self.message_user(request, f"Cancelled {cancelled} request(s).", messages.SUCCESS)
        if skipped:
            self.message_user(
                request,
                f"{skipped} request(s) had already ended and were left alone.",
                messages.WARNING,
            )


def as_json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@admin.register(Trace)
class TraceAdmin(ReadOnlyAdmin):
    list_display = [at_ms, "request_link", "from_state", "to_state", "server", "reason"]
    list_filter = ["to_state", "from_state", "server"]
    search_fields = ["reason", "request__id", "request__model_name"]
    list_select_related = ["request"]
    date_hierarchy = "at"
    ordering = ["-id"]  # newest first, by the key: rows are written as things happen
    show_full_result_count = False

    @admin.display(description="request", ordering="request__created_at")
    def request_link(self, trace: Trace) -> str:
        return f"{trace.request.model_name} {str(trace.request_id)[:8]}"


class AliveFilter(admin.SimpleListFilter):
    title = "heartbeat"
    parameter_name = "alive"

    def lookups(self, request, model_admin):
        return [("yes", "alive"), ("no", "stale")]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        fresh = Q(last_heartbeat__gte=Worker.live_since())
        return queryset.filter(fresh if self.value() == "yes" else ~fresh)


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "host",
        "pid",
        "started_at",
        "last_heartbeat",
        "alive",
        "processing",
        "passes",
    ]
    list_filter = [AliveFilter, "host"]
    search_fields = ["host", "pid"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(n_processing=Count("requests", filter=Q(requests__state=State.PROCESSING)))
        )

    @admin.display(boolean=True, description="alive")
    def alive(self, worker: Worker) -> bool:
        return worker.is_live()

    @admin.display(description="processing", ordering="n_processing")
    def processing(self, worker: Worker) -> int:
        return worker.n_processing

    @admin.display(description="passes", ordering="failing_since")
    def passes(self, worker: Worker) -> str:
        if worker.failing_since is None:
            return "working"
        return f"failing since {worker.failing_since:%Y-%m-%d %H:%M:%S}: {worker.failing_error}"


from . import admin_operations  # noqa: E402, F401 (intents and callbacks)
