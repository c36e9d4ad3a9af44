"""`kill -USR1` on a Switchyard process prints every thread's stack and the process goes on:
for an operator looking at one that seems stuck."""

import os
import signal

import pytest

from tests.conftest import database_url, free_port
from tests.support.manage_process import ManageProcess

pytestmark = pytest.mark.django_db(transaction=True)


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url()}
    web = ManageProcess(
        ["serve", "--no-scheduler", "--port", str(port)], env, lambda line: "is serving" in line
    )
    try:
        web.proc.send_signal(signal.SIGUSR1)
        web.wait_for_line("most recent call first")
        assert web.proc.poll() is None, "".join(web.log)
    finally:
        web.proc.terminate()
        out = web.output(timeout=30)
    assert "Current thread" in out or "Thread 0x" in out, out
