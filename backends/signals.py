"""The dashboard and the workers hear of the servers, models and deployments an operator
adds, edits or deletes (the admin, a configuration file, the operator API). The dashboard,
as it hears of the worker's own changes (`channel_hints.dashboard_changed`): a pruned server
left its card on every open dashboard until something else changed. The workers, so that a
new server is asked what it holds, and what waits for a new deployment is routed, at once
(not at the next status sync or poll). After the commit; the dashboards coalesce hints."""

import functools

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from scheduler import channel_hints, wakeup

from .models import Deployment, Model, Server


@receiver([post_save, post_delete], sender=Server)
@receiver([post_save, post_delete], sender=Model)
@receiver([post_save, post_delete], sender=Deployment)
def operator_changed(using: str, update_fields=None, **kwargs) -> None:
    # On the database the row was written to (the bench writes its own through an alias).
    transaction.on_commit(channel_hints.dashboard_changed, using=using)
    if update_fields is None:  # not the worker's own fill of a fact it learnt
        transaction.on_commit(functools.partial(wakeup.wake_workers, using), using=using)
