"""`manage.py bootstrap`, the first step of `make run`."""

import re
from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from backends.models import Deployment, Model, Server
from tests import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

CREATED = re.compile(r"Created the admin user: (\S+) / (\S+)")


def bootstrap() -> str:
    out = StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


def test_first_run_loads_the_demo_and_creates_an_admin_once():
    first = bootstrap()

    assert [s.kind for s in Server.objects.all()] == ["simulated", "simulated"]
    assert Model.objects.count() == 4
    username, password = CREATED.search(first).groups()
    user = authenticate(username=username, password=password)
    assert user is not None and user.is_superuser
    assert len(password) >= 16

    rows = Deployment.objects.count()
    second = bootstrap()
    assert not CREATED.search(second)
    assert password not in second
    assert "demo data not loaded" in second
    assert Deployment.objects.count() == rows
    assert get_user_model().objects.count() == 1


def test_existing_servers_mean_no_demo_data():
    factories.server("gpu-1", kind="openai", base_url="http://127.0.0.1:1234")

    bootstrap()

    assert list(Server.objects.values_list("name", flat=True)) == ["gpu-1"]
    assert not Model.objects.exists()


def test_an_existing_superuser_means_no_new_user():
    get_user_model().objects.create_superuser("root", "", "secret")

    assert not CREATED.search(bootstrap())
    assert get_user_model().objects.count() == 1


def test_an_ordinary_user_called_admin_is_not_taken_over():
    plain = get_user_model().objects.create_user("admin", "", "theirs")

    username, _ = CREATED.search(bootstrap()).groups()

    assert username.startswith("admin-")
    plain.refresh_from_db()
    assert not plain.is_superuser
    assert plain.check_password("theirs")
