from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import KEY_MARK, ApiKey, KeyUsage


class UsageInline(admin.TabularInline):
    model = KeyUsage
    fields = ["day", "requests", "prompt_tokens", "completion_tokens", "processing_s"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ["-day"]
    show_change_link = False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "shown_prefix",
        "usable",
        "operator",
        "max_priority",
        "default_priority",
        "rpm",
        "max_waiting",
        "max_processing",
        "weight",
        "created_at",
        "expires_at",
    ]
    list_filter = ["revoked", "operator", "max_priority"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["shown_prefix", "created_at"]
    actions = ["revoke", "restore"]
    inlines = [UsageInline]
    fieldsets = [
        (None, {"fields": ["name", "shown_prefix", "created_at", "expires_at", "revoked"]}),
        ("What it may do", {"fields": ["operator", "allowed_models", "max_priority"]}),
        (
            "Limits",
            {"fields": ["default_priority", "rpm", "max_waiting", "max_processing", "weight"]},
        ),
    ]

    @admin.display(description="key starts", ordering="prefix")
    def shown_prefix(self, key: ApiKey) -> str:
        return f"{KEY_MARK}{key.prefix}…" if key.prefix else "(made on save)"

    @admin.display(boolean=True, description="usable")
    def usable(self, key: ApiKey) -> bool:
        return key.is_usable()

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if not change:
            made, secret = ApiKey.generate(obj.name)
            obj.prefix, obj.hashed_key = made.prefix, made.hashed_key
            super().save_model(request, obj, form, change)
            self.message_user(
                request,
                f"The key for {obj.name} is {secret} — copy it now: it is shown only once"
                " and cannot be recovered.",
                messages.WARNING,
            )
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke the selected keys (refused within 5 s)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.update(revoked=True)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)

    @admin.action(description="Restore the selected keys")
    def restore(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.update(revoked=False)
        self.message_user(request, f"Restored {count} key(s).", messages.SUCCESS)


@admin.register(KeyUsage)
class KeyUsageAdmin(admin.ModelAdmin):
    list_display = [
        "day",
        "api_key",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "processing_s",
    ]
    list_filter = ["day", "api_key"]
    date_hierarchy = "day"
    readonly_fields = [f.name for f in KeyUsage._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
