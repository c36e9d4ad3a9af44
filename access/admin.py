from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from . import usage
from .models import KEY_MARK, ApiKey, Team, masked


def used_against(used: dict[str, float], most_s: int | None, most_tokens: int | None) -> str:
    """Today's use beside the daily quotas, as the admin shows it."""
    tokens = usage.tokens(used)
    seconds = f"{used['processing_s']:.0f} s of processing"
    if most_s is not None:
        seconds += f" of {most_s}"
    words = f"{tokens} tokens" + (f" of {most_tokens}" if most_tokens is not None else "")
    return f"{seconds}; {words} (requests that ended; renews at 00:00 UTC)"


def usage_table(found: usage.Usage) -> str:
    """Usage by day, newest first, summed over the keys in `found`."""
    days = usage.by_day(found)
    if not days:
        return "No request has ended yet."
    return format_html(
        "<table><tr><th>Day</th><th>Requests</th><th>Prompt tokens</th>"
        "<th>Completion tokens</th><th>Processing s</th></tr>{}</table>",
        format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    day,
                    f["requests"],
                    f["prompt_tokens"],
                    f["completion_tokens"],
                    round(f["processing_s"], 1),
                )
                for day, f in sorted(days.items(), reverse=True)
            ),
        ),
    )


def prefix_shown(key: ApiKey) -> str:
    """`sy-1a2b3c4d…` on one line (a list's narrow column would break it at the dash)."""
    return format_html('<span style="white-space: nowrap">{}{}…</span>', KEY_MARK, key.prefix)


def limits_of(holder: ApiKey | Team) -> str:
    """A key's or a team's limits in a few words, for the lists: `60/min · 2 at once`."""
    parts = []
    if getattr(holder, "rpm", None) is not None:
        parts.append(f"{holder.rpm}/min")
    if getattr(holder, "max_waiting", None) is not None:
        parts.append(f"{holder.max_waiting} waiting")
    if holder.max_processing is not None:
        parts.append(f"{holder.max_processing} at once")
    if holder.daily_processing_s is not None:
        parts.append(f"{holder.daily_processing_s:,} s a day")
    if holder.daily_tokens is not None:
        parts.append(f"{holder.daily_tokens:,} tokens a day")
    return " · ".join(parts) or "none"


class UsageChangeList(ChangeList):
    """A page of keys or teams, each with what it used today, read once for the page."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        found = usage.today_by(timezone.now(), teams=self.model is Team)
        for holder in self.result_list:
            holder.listed_usage = found.get(holder.pk)


class UsageColumns:
    """What a key, or all a team's keys, used: today against its daily quotas, and by day
    over the last 30 days; in the lists, its limits and today's use in a few words."""

    def get_changelist(self, request: HttpRequest, **kwargs):
        return UsageChangeList

    @admin.display(description="limits")
    def limits(self, holder: ApiKey | Team) -> str:
        return limits_of(holder)

    @admin.display(description="used today")
    def used_today_listed(self, holder: ApiKey | Team) -> str:
        used = getattr(holder, "listed_usage", None)
        if not used:
            return "-"
        tokens = usage.tokens(used)
        n = used["requests"]
        return (
            f"{n} request{'' if n == 1 else 's'} · {tokens:,} tokens · {used['processing_s']:.0f} s"
        )

    @admin.display(description="used today")
    def used_today(self, holder: ApiKey | Team) -> str:
        if holder.pk is None:
            return "—"
        used = usage.today(timezone.now(), **usage.of(holder))
        return used_against(used, holder.daily_processing_s, holder.daily_tokens)

    @admin.display(description="usage")
    def usage_by_day(self, holder: ApiKey | Team) -> str:
        if holder.pk is None:
            return "—"
        since = timezone.now() - timedelta(days=30)
        return usage_table(usage.usage(since=since, **usage.of(holder)))


class KeyInline(admin.TabularInline):
    model = ApiKey
    fields = ["name", "shown_prefix", "weight", "max_processing", "revoked"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # a key is made on its own page, where its secret is shown once

    @admin.display(description="key starts")
    def shown_prefix(self, key: ApiKey) -> str:
        return prefix_shown(key)


@admin.register(Team)
class TeamAdmin(UsageColumns, admin.ModelAdmin):
    list_display = ["name", "key_count", "weight", "limits", "used_today_listed"]
    search_fields = ["name"]
    readonly_fields = ["used_today", "usage_by_day"]
    fieldsets = [
        (None, {"fields": ["name"]}),
        ("Share of the slots", {"fields": ["weight", "max_processing"]}),
        ("Daily quotas (UTC)", {"fields": ["daily_processing_s", "daily_tokens", "used_today"]}),
        ("Usage of all its keys (UTC days, the last 30)", {"fields": ["usage_by_day"]}),
    ]
    inlines = [KeyInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(keys_in=Count("keys"))

    @admin.display(description="keys", ordering="keys_in")
    def key_count(self, team: Team) -> int:
        return getattr(team, "keys_in", 0)


@admin.register(ApiKey)
class ApiKeyAdmin(UsageColumns, admin.ModelAdmin):
    list_display = [
        "name",
        "shown_prefix",
        "team",
        "usable",
        "operator",
        "max_priority",
        "default_priority",
        "weight",
        "limits",
        "used_today_listed",
        "created_at",
    ]
    list_filter = ["revoked", "operator", "max_priority", "team"]
    list_select_related = ["team"]
    search_fields = ["name", "prefix"]
    readonly_fields = [
        "shown_prefix",
        "created_at",
        "shown_webhook_secret",
        "used_today",
        "usage_by_day",
    ]
    actions = ["revoke", "restore", "rotate_webhook_secret"]
    fieldsets = [
        (
            None,
            {"fields": ["name", "team", "shown_prefix", "created_at", "expires_at", "revoked"]},
        ),
        ("What it may do", {"fields": ["operator", "allowed_models", "max_priority"]}),
        ("Job callbacks", {"fields": ["shown_webhook_secret"]}),
        ("Streams", {"fields": ["stream_progress"]}),
        (
            "Limits",
            {"fields": ["default_priority", "rpm", "max_waiting", "max_processing", "weight"]},
        ),
        ("Daily quotas (UTC)", {"fields": ["daily_processing_s", "daily_tokens", "used_today"]}),
        ("Usage (UTC days, the last 30)", {"fields": ["usage_by_day"]}),
    ]

    @admin.display(description="key starts", ordering="prefix")
    def shown_prefix(self, key: ApiKey) -> str:
        return prefix_shown(key) if key.prefix else "(made on save)"

    @admin.display(description="webhook secret")
    def shown_webhook_secret(self, key: ApiKey) -> str:
        if key.pk is None:
            return "(made on save, shown once)"
        if not key.webhook_secret:
            return "none: its callbacks are signed with SWITCHYARD_WEBHOOK_SECRET"
        return f"{masked(key.webhook_secret)} (shown once; the action Rotate makes a new one)"

    @admin.display(boolean=True, description="usable")
    def usable(self, key: ApiKey) -> bool:
        return key.is_usable()

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if not change:
            made, secret = ApiKey.generate(obj.name)
            obj.prefix, obj.hashed_key = made.prefix, made.hashed_key
            obj.webhook_secret = made.webhook_secret
            super().save_model(request, obj, form, change)
            self.message_user(
                request,
                f"The key for {obj.name} is {secret} — copy it now: it is shown only once"
                f" and cannot be recovered. Its webhook secret is {obj.webhook_secret} (it"
                " signs the callbacks of its jobs; shown once too).",
                messages.WARNING,
            )
            return
        super().save_model(request, obj, form, change)

    @admin.action(
        description="Revoke the selected keys (refused everywhere within SWITCHYARD_AUTH_CACHE_S)"
    )
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.update(revoked=True)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)

    @admin.action(description="Rotate the webhook secret of the selected keys (shown once)")
    def rotate_webhook_secret(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            self.message_user(
                request,
                f"The new webhook secret of {key} is {key.rotate_webhook_secret()} — copy it"
                " now: it is shown only once. Callbacks are signed with it from now on.",
                messages.WARNING,
            )

    @admin.action(description="Restore the selected keys")
    def restore(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.update(revoked=False)
        self.message_user(request, f"Restored {count} key(s).", messages.SUCCESS)
