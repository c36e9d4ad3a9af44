"""The servers a management command names, in the order named; `default` when it names
none. An unknown name is a CommandError that names it."""

from django.core.management.base import CommandError
from django.db.models import QuerySet

from backends.models import Server


def servers_named(names: list[str], default: QuerySet[Server]) -> list[Server]:
    if not names:
        return list(default)
    found = {s.name: s for s in Server.objects.filter(name__in=names)}
    if missing := [name for name in names if name not in found]:
        raise CommandError(f"no such server: {', '.join(missing)}")
    return [found[name] for name in names]
