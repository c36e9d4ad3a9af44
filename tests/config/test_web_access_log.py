"""A web process's access log (daphne's) names a watch page without its key: who holds the
link reads the answer; and its status lines carry the standard reason (Twisted has none for
some codes Switchyard answers, such as 429)."""

import signal

import httpx
import pytest

from access.models import ApiKey
from access.watch import watch_url
from tests import factories
from tests.config.test_web_sigterm import config_web
from tests.conftest import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_access_log_leaves_out_a_watch_links_key_and_status_lines_have_reasons():
    link = watch_url(factories.request("m1").pk)
    request_id, key = link.strip("/").split("/")[-1].split(":")
    port = free_port()
    web = config_web(port, SWITCHYARD_AUTH="required")
    assert httpx.get(f"http://127.0.0.1:{port}{link}").status_code == 200
    paced, secret = ApiKey.generate("paced", rpm=0)
    paced.save()
    refused = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert (refused.status_code, refused.reason_phrase) == (429, "Too Many Requests")
    web.proc.send_signal(signal.SIGTERM)
    log = "".join(web.log) + web.proc.stdout.read()
    web.proc.wait(timeout=30)
    assert f'"GET /watch/{request_id}:…/" 200' in log, log
    assert key not in log
