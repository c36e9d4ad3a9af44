"""Which commits wait for the disk. By default, every one. With SWITCHYARD_SKIP_FLUSH on, a
job's acceptance and a request's end by a failure, a cancel or an expiry still do; what the
system redoes by itself (a pass's routes and dispatches, unless it also ends a request; an
answer stored by its worker; the insert of a request whose caller waits for its answer) does
not. A caller whose row a database crash lost is told so."""

from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from backends.models import DeploymentState
from scheduler import sql, store
from scheduler.api import intake
from scheduler.api.errors import ApiError
from scheduler.api.inference import relay_sse
from scheduler.api.waiting import Subscription, until_finished
from scheduler.models import Request, State, Worker
from scheduler.transitions import Transition
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

NO_WAIT = "SET LOCAL synchronous_commit TO OFF"
BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def waits_for_disk(work) -> bool:
    with CaptureQueriesContext(connection) as captured:
        work()
    return not any(NO_WAIT in q["sql"] for q in captured.captured_queries)


def synchronous_commit() -> str:
    return sql.fetch("SHOW synchronous_commit")[0][0] if settings.IS_POSTGRES else ""


@pytest.mark.django_db(transaction=True)
def test_without_waiting_for_disk_holds_for_its_own_transaction_only(knobs):
    knobs(SKIP_FLUSH=True)
    before = synchronous_commit()
    with transaction.atomic():
        sql.without_waiting_for_disk()
        inside = synchronous_commit()
    assert synchronous_commit() == before
    if settings.IS_POSTGRES:
        assert (before, inside) == ("on", "off")


def commits_that_wait() -> dict[str, bool]:
    """Each kind of commit, and whether it waited for the disk."""
    factories.model("m1")
    waited = {
        "job accepted": waits_for_disk(lambda: intake.accept("chat", BODY)),
        "request accepted": waits_for_disk(lambda: intake.accept("chat", BODY, caller_waits=True)),
    }
    worker = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=2), "m1", state=DeploymentState.LOADED)
    ready = factories.request("m1", state=State.READY, deployment=d)
    jobs: list = []

    def a_pass() -> None:
        jobs.extend(store.move_and_dispatch([], [(ready.pk, d.pk)], worker.pk)[1])

    waited["dispatch"] = waits_for_disk(a_pass)
    assert jobs[0] is not None
    arriving = factories.request("m1")
    route = Transition(arriving.pk, (State.PENDING,), State.READY, "on arrival")
    waited["send on arrival"] = waits_for_disk(
        lambda: store.send_on_arrival([route], [(arriving.pk, d.pk)], worker.pk)
    )

    waiting = factories.request("m1")
    expiry = Transition(waiting.pk, (State.PENDING,), State.EXPIRED, "waited too long")
    waited["expiry"] = waits_for_disk(lambda: store.move_and_dispatch([expiry], [], worker.pk))

    # An answer stored: should the database crash and lose it, the worker's connection dies
    # with it, the worker exits, and the request runs again (tests/scheduler/
    # test_worker_process.py).
    answer = store.Answer(jobs[0], {"ok": True}, 0.1)
    waited["answer"] = waits_for_disk(lambda: store.requests_completed([answer]))
    assert Request.objects.get(pk=ready.pk).state == State.COMPLETED
    return waited


@pytest.mark.django_db
def test_every_commit_waits_for_the_disk_by_default():
    assert settings.SWITCHYARD["SKIP_FLUSH"] is False
    assert all(commits_that_wait().values())


@pytest.mark.django_db
def test_skip_flush_lets_the_commits_the_system_redoes_skip_it(knobs):
    """On SQLite (WAL, synchronous=NORMAL) no commit waits for the disk anyway: nothing to set."""
    knobs(SKIP_FLUSH=True)
    redone = not settings.IS_POSTGRES
    assert commits_that_wait() == {
        "job accepted": True,  # its 202 and id are a promise
        "request accepted": redone,  # its caller waits on its open connection
        "dispatch": redone,
        "send on arrival": redone,
        "expiry": True,  # a request's end
        "answer": redone,
    }


@pytest.fixture
async def lost_request() -> AsyncIterator[Subscription]:
    """A caller waiting on a request whose row is gone, as after a database crash."""
    request = await sync_to_async(factories.request)("m1")
    sub = await Subscription(request.pk).open()
    await Request.objects.filter(pk=request.pk).adelete()
    yield sub
    await sub.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_thread_closed")
async def test_a_waiting_caller_whose_row_was_lost_is_told_to_send_it_again(lost_request):
    with pytest.raises(ApiError) as lost:
        await until_finished(lost_request, every_s=0.01)
    assert (lost.value.status, lost.value.code) == (503, "request_lost")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_thread_closed")
async def test_a_streaming_caller_whose_row_was_lost_gets_an_error_event(lost_request, knobs):
    knobs(WAITING_COMMENT_S=0.01)
    events = [event async for event in relay_sse(lost_request, known=Request(kind="chat"))]
    assert '"code": "request_lost"' in events[-2]
    assert events[-1] == "data: [DONE]\n\n"
