"""A web process told to stop (SIGTERM) drains: it takes no new connection, answers new calls
on open ones `503 restarting` (nothing stored), and lets the calls it holds be answered, for
up to `SWITCHYARD_DRAIN_S`. A caller still waiting then is told (503 `restarting`, or a
stream's last event and `[DONE]`) that its request stays stored for a worker to run (not
cancelled as if its caller had hung up)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from scheduler.models import Request
from tests import factories
from tests.conftest import database_url, free_port
from tests.support.manage_process import ROOT, ManageProcess
from tests.support.openai_upstream import Upstream
from tests.support.polling import eventually

pytestmark = pytest.mark.django_db(transaction=True)
EXIT_WITHIN_S = 15.0


def listening(port: int, web: ManageProcess) -> None:
    """Until the port takes connections (daphne says nothing when it does)."""

    def takes_connections() -> bool:
        assert web.proc.poll() is None, "".join(web.log)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    eventually(takes_connections, what=f"port {port} taking connections")


def config_web(port: int, **env: str) -> ManageProcess:
    """`python -m config.web` on the test database and `port` (with `env`), once it takes
    connections."""
    full = {**os.environ, "DATABASE_URL": database_url(), **env}
    args = ["-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    web = ManageProcess(
        args, full, lambda line: "web process on" in line, program=("-m", "config.web")
    )
    listening(port, web)
    return web


@pytest.mark.parametrize(
    ("program", "stream", "idempotent"),
    [("serve", False, False), ("config.web", False, True), ("config.web", True, False)],
)
def test_sigterm_stops_a_web_process_with_a_caller_waiting(program, stream, idempotent):
    factories.deployment(factories.server("s"), "m1")  # never served: no worker runs
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "SWITCHYARD_DRAIN_S": "1"}
    if program == "serve":
        args, run = ["serve", "--no-scheduler", "--port", str(port)], ("manage.py",)
        ready = "is serving on"
    else:
        args = ["-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
        run, ready = ("-m", "config.web"), "web process on"
    web = ManageProcess(args, env, lambda line: ready in line, program=run)
    listening(port, web)
    answered: list[object] = []

    def wait_for_answer() -> None:
        try:
            answered.append(
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={
                        "model": "m1",
                        "messages": [{"role": "user", "content": "hi"}],
                        "stream": stream,
                    },
                    headers={"Idempotency-Key": "k1"} if idempotent else {},
                    timeout=60,
                )
            )
        except httpx.HTTPError as error:
            answered.append(error)

    caller = threading.Thread(target=wait_for_answer)
    caller.start()

    def stored() -> bool:  # another process stores it: poll the table
        assert web.proc.poll() is None, "".join(web.log)
        return Request.objects.exists()

    eventually(stored, what="the request stored")

    started = time.monotonic()
    web.proc.send_signal(signal.SIGTERM)
    out = web.output(timeout=EXIT_WITHIN_S + 30)
    took = time.monotonic() - started
    print(f"exited in {took:.1f} s")
    assert took < EXIT_WITHIN_S, out
    assert "1 call(s) still open are told where their requests go on" in out, out
    caller.join(timeout=30)
    assert answered, "the caller was never let go"
    # Stored, and not cancelled: its caller did not hang up, the web process stopped (a
    # retry with its Idempotency-Key would find the answer).
    request = Request.objects.get()
    assert request.state == "pending"
    # Told so, as every call ends: an answer, or a stream's last event and [DONE].
    answer = answered[0]
    assert isinstance(answer, httpx.Response), answer
    if stream:
        assert answer.status_code == 200
        assert answer.text.endswith("data: [DONE]\n\n"), answer.text
        assert '"code": "restarting"' in answer.text and str(request.pk) in answer.text
    else:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "restarting"
        assert answer.headers["X-Request-Id"] == str(request.pk)
        if idempotent:  # a resend gets the answer: clients may resend by themselves
            assert answer.headers["Retry-After"] == "1"
            assert "x-should-retry" not in answer.headers
        else:  # a resend would run it twice: OpenAI's clients are told not to
            assert answer.headers["x-should-retry"] == "false"
            assert "twice" in answer.json()["error"]["message"]


def test_a_stopping_web_process_answers_the_calls_it_holds_and_takes_no_new_ones():
    upstream = Upstream(["m1"])
    upstream.gate = threading.Event()  # the answer waits until the web process drains
    srv = factories.server("up", kind="openai", base_url=upstream.url)
    factories.deployment(srv, "m1", state="loaded")
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "SWITCHYARD_DRAIN_S": "60"}
    web = ManageProcess(["serve", "--port", str(port)], env, lambda line: "is serving on" in line)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    kept_open = httpx.Client(timeout=30)  # a caller's pool: its connection stays open
    answered: list[httpx.Response] = []
    caller = threading.Thread(
        target=lambda: answered.append(httpx.post(url, json=body, timeout=60))
    )
    try:
        listening(port, web)
        assert kept_open.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        caller.start()
        assert upstream.arrived.wait(30), "".join(web.log)

        web.proc.send_signal(signal.SIGTERM)
        web.wait_for_line("stopping: no new calls; 1 open")

        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return False
            except ConnectionRefusedError:
                return True
            except ConnectionResetError:  # met the listener as it closed: ask again
                return False

        eventually(refused, what="the port refusing connections")
        # A new call on a connection the caller kept open: refused, and nothing stored.
        late = kept_open.post(url, json=body)
        assert late.status_code == 503, late.text
        assert late.json()["error"]["code"] == "restarting"
        assert "nothing was stored" in late.json()["error"]["message"]
        assert late.headers["Connection"] == "close"
        assert Request.objects.count() == 1
        assert web.proc.poll() is None  # still draining: the call it holds is not cut

        upstream.gate.set()
        caller.join(timeout=60)
        out = web.output(timeout=60)
    finally:
        upstream.gate.set()
        kept_open.close()
        upstream.close()
        if web.proc.poll() is None:
            web.proc.kill()
    assert answered and answered[0].status_code == 200, (answered, out)
    assert answered[0].json()["choices"][0]["message"]["content"] == "Hello from upstream"
    assert Request.objects.get().state == "completed"
    assert "still open" not in out, out


def test_a_second_signal_ends_the_drain_at_once():
    """Asked to stop again (a second Ctrl-C), a draining web process stops at once: its
    callers still waiting are told where their requests go on."""
    factories.deployment(factories.server("s"), "m1")  # never served: no worker runs
    port = free_port()
    web = config_web(port, SWITCHYARD_DRAIN_S="120")
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    answered: list[httpx.Response] = []
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    caller = threading.Thread(
        target=lambda: answered.append(httpx.post(url, json=body, timeout=60))
    )
    caller.start()
    eventually(Request.objects.exists, what="the request stored")

    started = time.monotonic()
    web.proc.send_signal(signal.SIGINT)
    web.wait_for_line("stopping: no new calls; 1 open")
    web.proc.send_signal(signal.SIGINT)
    out = web.output(timeout=EXIT_WITHIN_S + 30)
    assert time.monotonic() - started < EXIT_WITHIN_S, out
    caller.join(timeout=30)
    assert answered and answered[0].status_code == 503, (answered, out)
    assert answered[0].json()["error"]["code"] == "restarting"
    assert Request.objects.get().state == "pending"


def test_a_stopped_web_process_exits_with_a_request_thread_still_waiting():
    """A SIGTERM can stop the loop while a request's sync half (Django's sync middleware, in
    a pool thread) waits for the async rest: that thread never returns, and Python's own
    exit would join it forever. `exit_served` ends the process anyway, with its output."""
    program = (
        "import concurrent.futures, threading\n"
        "from config import event_loop\n"
        "never = threading.Event()\n"
        "concurrent.futures.ThreadPoolExecutor(1).submit(never.wait)\n"
        "print('stopped', flush=False)\n"
        "event_loop.exit_served()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert (done.returncode, done.stdout) == (0, "stopped\n"), done.stderr
