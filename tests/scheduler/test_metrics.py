import pytest

from tests import factories

pytestmark = pytest.mark.django_db


def test_metrics_report_queue_and_deployments(client):
    srv = factories.server("gpu-1")
    factories.deployment(srv, "qwen", state="loaded", in_flight=1)
    factories.request("qwen", priority=0)
    body = client.get("/metrics").content.decode()
    assert 'switchyard_requests{priority="interactive",state="pending"} 1.0' in body
    assert 'switchyard_deployments{server="gpu-1",state="loaded"} 1.0' in body
    assert 'switchyard_in_flight{model="qwen",server="gpu-1"} 1.0' in body
    assert 'switchyard_server_up{health="up",server="gpu-1"} 1.0' in body


def test_openapi_schema_is_served(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/requests" in response.content
