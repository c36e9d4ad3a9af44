"""The dashboard hears of the servers, models and deployments an operator adds, edits or
deletes (the admin, a configuration file, the operator API), as it hears of the worker's own
changes (`channel_hints.dashboard_changed`): a pruned server left its card on every open
dashboard until something else changed. The workers hear of a server's or a deployment's,
so that a new server is asked what it holds at once (not at the next status sync), and an
edit (its slots, enabled, a deployment enabled or pinned) is planned with at once, not at
the next poll. After the commit; the dashboards coalesce hints."""

import functools

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from scheduler import channel_hints, wakeup

from .models import Deployment, Model, Server


@receiver([post_save, post_delete], sender=Server)
@receiver([post_save, post_delete], sender=Model)
@receiver([post_save, post_delete], sender=Deployment)
def operator_changed(sender, using: str, **kwargs) -> None:
    # On the database the row was written to (the bench writes its own through an alias).
    transaction.on_commit(channel_hints.dashboard_changed, using=using)
    if sender is not Model:  # a model's edit changes no plan by itself
        transaction.on_commit(functools.partial(wakeup.wake_workers, using), using=using)
