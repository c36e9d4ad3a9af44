import logging

from django.contrib import admin, messages
from django.db.models import Count, Prefetch, Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from dashboard.state import load_progress
from scheduler.api.errors import ApiError
from scheduler.asking import ask_load, ask_unload
from scheduler.durations import spoken
from scheduler.models import Intent

from .checkup import OK, WARN, check_server
from .discovery import sync_server
from .models import (
    Deployment,
    DeploymentState,
    Health,
    Model,
    Server,
    available_again,
    unavailable_from,
)
from .secret_field import ServerForm

log = logging.getLogger(__name__)


def server_label(server: Server | None) -> str:
    """A server's name, marked when it is a simulated one so nobody mistakes it for hardware."""
    if server is None:
        return "-"
    return f"{server.name} (simulated)" if server.is_simulated else server.name


def in_seconds(value: float | None) -> str:
    """`1.5 s`, `46 ms`; `-` for none."""
    return "-" if value is None else spoken(value)


def to_the_ms(moment) -> str:
    """`2026-11-30 21:57:10.084 UTC`: a trace's steps often share their second."""
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local:%Z}"


def age(moment) -> str:
    """`3 minutes ago`, the exact time in its tooltip; `-` for never."""
    if moment is None:
        return "-"
    seconds = (timezone.now() - moment).total_seconds()
    since = f"{max(seconds, 0):.0f} s" if seconds < 60 else timesince(moment, depth=1)
    return format_html(
        '<span title="{}">{} ago</span>', moment.isoformat(timespec="seconds"), since
    )


class DeploymentInline(admin.TabularInline):
    model = Deployment
    extra = 0
    fields = [
        "model",
        "server_model_id",
        "state",
        "in_flight",
        "slots",
        "size_mb",
        "device",
        "pinned",
        "preload",
        "keep_loaded_hours",
        "idle_ttl_s",
        "expected_load_s",
        "load_options",
        "load_overrides",
    ]
    readonly_fields = ["state", "in_flight", "load_overrides"]
    autocomplete_fields = ["model"]


@admin.register(Server)
class ServerAdmin(admin.ModelAdmin):
    form = ServerForm  # its API key is never shown back (last 4 characters)
    list_display = [
        "name",
        "kind_label",
        "base_url",
        "enabled",
        "health_column",
        "slots",
        "loaded_models",
        "seen",
    ]
    list_filter = ["kind", "health", "enabled"]
    search_fields = ["name", "base_url"]
    readonly_fields = [
        "health",
        "last_seen",
        "last_error",
        "consecutive_failures",
        "cooldown_until",
    ]
    inlines = [DeploymentInline]
    actions = ["enable", "disable", "end_cooldown", "sync_models", "check_setup"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_loaded=Count("deployments", filter=Q(deployments__state=DeploymentState.LOADED)),
                n_deployments=Count("deployments"),
            )
        )

    @admin.display(description="kind", ordering="kind")
    def kind_label(self, server: Server) -> str:
        if server.is_simulated:
            return "⚠ simulated (demo)"
        return server.get_kind_display()

    @admin.display(description="health", ordering="health")
    def health_column(self, server: Server) -> str:
        """Its health, with the failures in a row and the end of a cooldown when it has them."""
        shown = server.get_health_display()
        if server.health == Health.COOLDOWN and server.cooldown_until:
            shown += f" until {timezone.localtime(server.cooldown_until):%H:%M:%S}"
        failures = server.consecutive_failures
        if failures:
            shown += f" ({failures} failure{'' if failures == 1 else 's'} in a row)"
        return shown

    @admin.display(description="models loaded", ordering="n_loaded")
    def loaded_models(self, server: Server) -> str:
        return f"{server.n_loaded} of {server.n_deployments}"

    @admin.display(description="last seen", ordering="last_seen")
    def seen(self, server: Server) -> str:
        return age(server.last_seen)

    @admin.action(description="Enable selected servers")
    def enable(self, request, queryset):
        n = queryset.update(enabled=True, unavailable_since=available_again("enabled"))
        self.message_user(request, f"{n} server(s) enabled.", messages.SUCCESS)

    @admin.action(description="Disable selected servers (no new work is sent)")
    def disable(self, request, queryset):
        n = queryset.update(enabled=False, unavailable_since=unavailable_from(timezone.now()))
        self.message_user(
            request, f"{n} server(s) disabled; work already sent finishes.", messages.SUCCESS
        )

    @admin.action(description="End cooldown now (probe at once)")
    def end_cooldown(self, request, queryset):
        n = queryset.filter(health=Health.COOLDOWN).update(cooldown_until=None)
        self.message_user(request, f"{n} server(s) will be probed now.", messages.SUCCESS)

    @admin.action(description="Check server set-up")
    def check_setup(self, request, queryset):
        for server in queryset:
            report = check_server(server)
            level = {OK: messages.SUCCESS, WARN: messages.WARNING}.get(report.worst, messages.ERROR)
            self.message_user(
                request,
                format_html_join(
                    mark_safe("<br>"), "{}", ((line,) for line in str(report).splitlines())
                ),
                level,
            )

    @admin.action(description="Sync models from server")
    def sync_models(self, request, queryset):
        for server in queryset:
            report = sync_server(server)
            self.message_user(
                request, str(report), messages.ERROR if report.error else messages.SUCCESS
            )


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "type",
        "alias_list",
        "takes",
        "context_length",
        "load_timeout_s",
        "deployment_count",
        "servers",
    ]
    list_filter = ["type", "deployments__server"]
    search_fields = ["name", "aliases"]

    def get_queryset(self, request):
        on_servers = Deployment.objects.select_related("server").order_by("server__name")
        return (
            super()
            .get_queryset(request)
            .annotate(n_deployments=Count("deployments"))
            .prefetch_related(Prefetch("deployments", queryset=on_servers))
        )

    @admin.display(description="aliases")
    def alias_list(self, model: Model) -> str:
        return ", ".join(model.aliases or []) or "-"

    @admin.display(description="takes besides text")
    def takes(self, model: Model) -> str:
        if model.capabilities is None:
            return "unknown" if model.type == "llm" else "-"
        return ", ".join(model.capabilities) or "text only"

    @admin.display(description="deployments", ordering="n_deployments")
    def deployment_count(self, model: Model) -> int:
        return model.n_deployments

    @admin.display(description="servers (state)")
    def servers(self, model: Model) -> str:
        return (
            ", ".join(f"{server_label(d.server)} ({d.state})" for d in model.deployments.all())
            or "-"
        )


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = [
        "model_column",
        "server_column",
        "state_column",
        "loaded_for",
        "in_flight_column",
        "size_mb",
        "device",
        "kept",
        "last_used",
        "times",
        "error_column",
    ]
    list_filter = [
        "state",
        "enabled",
        "load_cause",
        "server",
        "server__kind",
        "model__type",
        "pinned",
        "preload",
        "device",
    ]
    search_fields = ["model__name", "server__name", "server_model_id"]
    list_select_related = ["model", "server"]
    autocomplete_fields = ["model", "server"]
    readonly_fields = [
        "state",
        "state_changed_at",
        "load_started_at",
        "loaded_at",
        "load_cause",
        "displaced",
        "last_used_at",
        "last_interactive_at",
        "last_priority",
        "in_flight",
        "load_progress",
        "avg_load_s",
        "avg_inference_s",
        "load_failures",
        "next_load_at",
        "last_error",
        "last_error_code",
        "worker",
    ]
    actions = ["load_now", "unload", "reset_failed", "disable", "enable"]

    @admin.display(description="model", ordering="model__name")
    def model_column(self, deployment: Deployment) -> str:
        """The model, and the server's own name for it where that differs."""
        if deployment.server_model_id == deployment.model.name:
            return deployment.model.name
        return f"{deployment.model.name} (as {deployment.server_model_id})"

    @admin.display(description="server", ordering="server__name")
    def server_column(self, deployment: Deployment) -> str:
        return server_label(deployment.server)

    @admin.display(description="state", ordering="state")
    def state_column(self, deployment: Deployment) -> str:
        """A load under way says how far it is, as the dashboard's bar does; a disabled one
        says so first."""
        off = "" if deployment.enabled else "disabled, "
        load = load_progress(deployment, timezone.now())
        if load is None:
            return off + deployment.get_state_display()
        if load["fraction"] is None:
            return f"loading, {load['elapsed_s']:.0f} s"
        about = "~" if load["estimated"] else ""
        return f"loading, {about}{load['fraction']:.0%}"

    @admin.display(description="loaded for", ordering="load_cause")
    def loaded_for(self, deployment: Deployment) -> str:
        """Who asked for its load, while it is loading or loaded. Once it has gone, "-":
        beside "unloaded", the old cause reads as a load to come (its page keeps it)."""
        if deployment.state not in (DeploymentState.LOADING, DeploymentState.LOADED):
            return "-"
        return deployment.get_load_cause_display() or "-"

    @admin.display(description="in flight", ordering="in_flight")
    def in_flight_column(self, deployment: Deployment) -> str:
        """Requests it serves now, out of its own slots when it has them."""
        if deployment.slots is None:
            return str(deployment.in_flight)
        return f"{deployment.in_flight}/{deployment.slots}"

    @admin.display(description="kept")
    def kept(self, deployment: Deployment) -> str:
        """What keeps it loaded: pinned, preload, keep-loaded hours."""
        parts = [
            word
            for word, on in (("pinned", deployment.pinned), ("preload", deployment.preload))
            if on
        ]
        if deployment.keep_loaded_hours:
            parts.append(deployment.keep_loaded_hours)
        return ", ".join(parts) or "-"

    @admin.display(description="last used", ordering="last_used_at")
    def last_used(self, deployment: Deployment) -> str:
        return age(deployment.last_used_at)

    @admin.display(description="load / run (avg)", ordering="avg_load_s")
    def times(self, deployment: Deployment) -> str:
        """As measured; before a load is, what its operator expects of one (`~90 s`)."""
        load = in_seconds(deployment.avg_load_s)
        if deployment.avg_load_s is None and deployment.expected_load_s:
            load = f"~{deployment.expected_load_s} s expected"
        if load == "-" and deployment.avg_inference_s is None:
            return "-"
        return f"{load} / {in_seconds(deployment.avg_inference_s)}"

    @admin.display(description="last error", ordering="load_failures")
    def error_column(self, deployment: Deployment) -> str:
        if not deployment.load_failures:
            return deployment.last_error or "-"
        n = deployment.load_failures
        if deployment.last_error_code == "busy":  # the server is full for now: asked again
            failed = f"{n} load{'s' if n > 1 else ''} refused, server busy"
        else:
            failed = f"{n} failed load{'s' if n > 1 else ''}"
        return f"{failed}: {deployment.last_error}" if deployment.last_error else failed

    @admin.action(description="Load now (evicting idle models, as the scheduler would)")
    def load_now(self, request, queryset):
        self.ask(request, queryset, Intent.Action.LOAD)

    @admin.action(description="Unload (a busy model once its requests finish)")
    def unload(self, request, queryset):
        self.ask(request, queryset, Intent.Action.UNLOAD)

    def ask(self, request, queryset, action: str) -> None:
        """As the operator API asks (`scheduler.asking`): an intent per deployment, carried
        out by a worker's loop; each one refused says why."""
        by = f"user {request.user.get_username()}"
        asked = 0
        for d in queryset.select_related("model", "server"):
            try:
                if action == Intent.Action.LOAD:
                    intent = ask_load(d, by, via="the admin")
                else:
                    intent = ask_unload(d, by, via="the admin")
            except ApiError as refused:
                self.message_user(request, refused.message, messages.WARNING)
                continue
            asked += 1
            log.info("%s of %s asked in admin by %s (intent %s)", action, d, by, intent.pk)
        if asked:
            intents = reverse("admin:scheduler_intent_changelist")
            self.message_user(
                request,
                format_html(
                    "{} {}(s) asked; a worker carries them out at its next pass: follow them"
                    ' under <a href="{}">Intents</a>.',
                    asked,
                    action,
                    intents,
                ),
                messages.SUCCESS,
            )

    @admin.action(description="Disable: send nothing there, unload once idle")
    def disable(self, request, queryset):
        self.switch(request, queryset, False)

    @admin.action(description="Enable: serve there again")
    def enable(self, request, queryset):
        self.switch(request, queryset, True)

    def switch(self, request, queryset, enabled: bool) -> None:
        changed = list(queryset.exclude(enabled=enabled).select_related("model", "server"))
        Deployment.objects.filter(pk__in=[d.pk for d in changed]).update(enabled=enabled)
        verb = "enabled" if enabled else "disabled"
        for d in changed:
            log.info("deployment %s %s in admin by %s", d, verb, request.user)
        self.message_user(
            request,
            f"{len(changed)} deployment(s) {verb}; the worker acts on it at its next pass.",
            messages.SUCCESS if changed else messages.WARNING,
        )

    @admin.action(description="Reset failed deployments (allow loading again)")
    def reset_failed(self, request, queryset):
        n = queryset.filter(state=DeploymentState.FAILED).update(
            state=DeploymentState.UNLOADED,
            state_changed_at=timezone.now(),
            load_failures=0,
            last_error="",
            last_error_code="",
            next_load_at=None,
        )
        skipped = queryset.count() - n
        self.message_user(
            request,
            f"{n} deployment(s) reset."
            + (f" {skipped} were not failed and were left alone." if skipped else ""),
            messages.SUCCESS if n else messages.WARNING,
        )
