"""Every change of a request's state goes through `move`: a compare-and-set on the row in the
same transaction as its Trace row, announced after commit."""

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from . import announce, wakeup
from .models import Request, State, Trace

S = State
ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.NEEDS_LOADING, S.READY, S.FAILED, S.CANCELLED, S.EXPIRED},
    S.NEEDS_LOADING: {S.READY, S.PENDING, S.FAILED, S.CANCELLED, S.EXPIRED},
    S.READY: {S.PROCESSING, S.PENDING, S.FAILED, S.CANCELLED, S.EXPIRED},
    # Back to ready: retry after a failure; back to pending: the model went away, or the
    # worker that held it died.
    S.PROCESSING: {S.COMPLETED, S.FAILED, S.READY, S.PENDING},
}


class ImpossibleTransition(ValueError):
    pass


def move(
    request_id,
    from_states: Iterable[str],
    to_state: str,
    reason: str,
    at_server: str = "",
    **fields,
) -> bool:
    """Move the request if it is still in one of `from_states`. False if it moved meanwhile."""
    from_states = tuple(from_states)
    for source in from_states:
        if to_state not in ALLOWED.get(source, set()):
            raise ImpossibleTransition(f"{source} → {to_state}")
    now = timezone.now()
    if to_state in (S.COMPLETED, S.FAILED, S.CANCELLED, S.EXPIRED):
        fields.setdefault("finished_at", now)
    with transaction.atomic():
        row = (
            Request.objects.select_for_update()
            .filter(pk=request_id, state__in=from_states)
            .values_list("state", flat=True)
            .first()
        )
        if row is None:
            return False
        Request.objects.filter(pk=request_id).update(state=to_state, **fields)
        Trace.objects.create(
            request_id=request_id,
            at=now,
            from_state=row,
            to_state=to_state,
            server=at_server or "",
            reason=reason,
        )
        if to_state in (S.CANCELLED,):
            wakeup.notify_in_transaction()
        transaction.on_commit(lambda: announce.request_moved(request_id, to_state))
    return True
