from django.contrib import admin, messages
from django.db.models import Count, Q

from .models import Deployment, DeploymentState, Model, Server


class DeploymentInline(admin.TabularInline):
    model = Deployment
    extra = 0
    fields = [
        "model",
        "server_model_id",
        "state",
        "in_flight",
        "size_mb",
        "device",
        "pinned",
        "preload",
        "idle_ttl_s",
        "load_options",
    ]
    readonly_fields = ["state", "in_flight"]


@admin.register(Server)
class ServerAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind_label",
        "base_url",
        "enabled",
        "health",
        "slots",
        "loaded_models",
        "last_seen",
        "consecutive_failures",
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
    actions = ["enable", "disable", "end_cooldown"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_loaded=Count("deployments", filter=Q(deployments__state=DeploymentState.LOADED))
            )
        )

    @admin.display(description="kind", ordering="kind")
    def kind_label(self, server: Server) -> str:
        return f"{server.get_kind_display()}" + (" ⚠ simulated" if server.is_simulated else "")

    @admin.display(description="loaded", ordering="n_loaded")
    def loaded_models(self, server: Server) -> int:
        return server.n_loaded

    @admin.action(description="Enable selected servers")
    def enable(self, request, queryset):
        queryset.update(enabled=True)

    @admin.action(description="Disable selected servers (no new work is sent)")
    def disable(self, request, queryset):
        queryset.update(enabled=False)

    @admin.action(description="End cooldown now (probe at once)")
    def end_cooldown(self, request, queryset):
        n = queryset.filter(health="cooldown").update(cooldown_until=None)
        self.message_user(request, f"{n} server(s) will be probed now.", messages.SUCCESS)


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "type", "aliases", "load_timeout_s", "deployment_count"]
    list_filter = ["type"]
    search_fields = ["name", "aliases"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_deployments=Count("deployments"))

    @admin.display(description="deployments", ordering="n_deployments")
    def deployment_count(self, model: Model) -> int:
        return model.n_deployments


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = [
        "model",
        "server",
        "server_model_id",
        "state",
        "in_flight",
        "pinned",
        "preload",
        "last_used_at",
        "avg_load_s",
        "avg_inference_s",
        "last_error",
    ]
    list_filter = ["state", "server", "pinned", "preload", "device"]
    search_fields = ["model__name", "server__name", "server_model_id"]
    list_select_related = ["model", "server"]
    readonly_fields = [
        "state",
        "state_changed_at",
        "load_started_at",
        "loaded_at",
        "last_used_at",
        "last_interactive_at",
        "last_priority",
        "in_flight",
        "load_progress",
        "load_progress_estimated",
        "avg_load_s",
        "avg_inference_s",
        "load_failures",
        "next_load_at",
        "last_error",
        "last_error_code",
        "worker",
    ]
    actions = ["reset_failed"]

    @admin.action(description="Reset failed deployments (allow loading again)")
    def reset_failed(self, request, queryset):
        n = queryset.filter(state=DeploymentState.FAILED).update(
            state=DeploymentState.UNLOADED,
            load_failures=0,
            last_error="",
            last_error_code="",
            next_load_at=None,
        )
        self.message_user(request, f"{n} deployment(s) reset.", messages.SUCCESS)
