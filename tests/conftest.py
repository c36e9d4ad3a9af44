import asyncio
import os
import socket
import threading

import pytest
import uvloop
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, connections

from config import event_loop
from scheduler.api.inbox import close_inbox
from scheduler.database_thread import in_database_thread
from tests.support.manage_process import ManageProcess
from tests.support.openai_upstream import Upstream

# Tests run without API keys unless they are about them (marked `auth`, or starting
# processes with SWITCHYARD_AUTH=required): processes they start inherit this.
os.environ["SWITCHYARD_AUTH"] = "off"

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # Parallel test workers (`-n`) each have a database of their own (pytest-django); on
    # Redis, whose pub/sub no database number separates, their processes talk under a prefix
    # of their own. Set here, after the settings were read: for this process and its children.
    os.environ["REDIS_PREFIX"] = f"test-{worker}"
    if settings.REDIS_URL:
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = os.environ["REDIS_PREFIX"]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and before it drops the test database: the threads that outlive a
    test (the worker's database thread, asgiref's sync thread) let go of their connections,
    which PostgreSQL would otherwise refuse to drop it under (a warning at the end, and the
    database left behind). A process a test started may still be on its way out, holding
    one too: its session is ended."""
    yield
    asyncio.run(in_database_thread(connections.close_all)())
    asyncio.run(sync_to_async(connections.close_all)())
    if settings.IS_POSTGRES:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        connection.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    """The URL of the test database, for processes the tests start."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def event_loop_policy():
    """Async tests run on the loop Switchyard's processes run on (`config.event_loop`)."""
    if event_loop.chosen() == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


@pytest.fixture
def fast_passwords(settings):
    """For tests that create users: the real password hasher is slow on purpose."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
async def inbox_closed():
    """The API inbox of the test's event loop closed with the test: its LISTEN connection
    would keep the test database from being dropped."""
    yield
    await close_inbox()


def pytest_collection_modifyitems(items):
    # Every async test's: a sync test has no loop of its own to close it in.
    for item in items:
        if asyncio.iscoroutinefunction(getattr(item, "function", None)):
            item.fixturenames.append("inbox_closed")


@pytest.fixture(autouse=True)
def auth_mode(request, settings):
    """API keys off, except in tests marked `auth` (see access's tests)."""
    settings.SWITCHYARD_AUTH = "required" if request.node.get_closest_marker("auth") else "off"


@pytest.fixture(autouse=True)
def no_drain(settings):
    """A worker stopped by a test hands its work back at once, unless the test is about
    draining (requests held at a gated upstream would otherwise hold up every teardown)."""
    settings.SWITCHYARD = {**settings.SWITCHYARD, "DRAIN_S": 0.0}


@pytest.fixture
def knobs(settings):
    """Change scheduler knobs for one test: `knobs(RETRY_BASE_S=0.01)`."""

    def change(**values):
        settings.SWITCHYARD = {**settings.SWITCHYARD, **values}
        return settings.SWITCHYARD

    return change


class ServedSwitchyard(ManageProcess):
    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            ["serve", "--port", str(self.port)], env, lambda line: "is serving on" in line
        )

    def stop(self) -> str:
        self.proc.terminate()
        return self.output(timeout=30)


@pytest.fixture
def served(transactional_db):
    """Switchyard as it runs embedded (`manage.py serve`): web app and scheduler in one
    process, on the test database. Create servers and models before starting it."""
    started: list[ServedSwitchyard] = []

    def start(**extra_env: str) -> ServedSwitchyard:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SWITCHYARD_POLL_INTERVAL_S": "1",
            "SWITCHYARD_DRAIN_S": "0",
            "SWITCHYARD_WAITING_COMMENT_S": "0.5",
            **extra_env,
        }
        started.append(ServedSwitchyard(env))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@pytest.fixture(autouse=True)
def fresh_simulated_servers():
    """Simulated servers keep state in process memory: start every test with none."""
    from backends.adapters import simulated

    simulated._SERVERS.clear()


@pytest.fixture
def gated_upstream():
    """An OpenAI-compatible upstream that holds every answer until `gate` is set: a request
    stays `processing` for as long as a test needs."""
    up = Upstream(["m1"])
    up.gate = threading.Event()
    yield up
    up.close()
