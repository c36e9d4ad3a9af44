"""/api/schema/ and /api/docs/: with keys required, for a good key or a staff login only."""

import pytest
from django.contrib.auth import get_user_model

from tests.access.conftest import bearer

PAGES = ["/api/schema/", "/api/schema/?format=json", "/api/docs/"]
pytestmark = pytest.mark.usefixtures("fast_passwords")


@pytest.mark.auth
@pytest.mark.parametrize("page", PAGES)
def test_without_a_key_or_staff_login_the_schema_is_refused(client, make_key, page):
    for headers in [{}, {"Authorization": "Bearer sy-00000000.nope"}]:
        r = client.get(page, headers=headers)
        assert r.status_code == 401
        assert r["Content-Type"].startswith("application/json")
        assert r["WWW-Authenticate"] == 'Bearer realm="switchyard"'
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "invalid_api_key"
    client.force_login(get_user_model().objects.create_user("app", password="x" * 12))
    assert client.get(page).status_code == 401  # a login that is not staff's


@pytest.mark.auth
@pytest.mark.parametrize("page", PAGES)
def test_any_good_key_or_a_staff_login_may_read_it(client, make_key, page):
    _, key = make_key("app")  # no operator flag needed
    assert client.get(page, headers=bearer(key)).status_code == 200
    staff = get_user_model().objects.create_user("ops", password="x" * 12, is_staff=True)
    client.force_login(staff)
    assert client.get(page).status_code == 200


@pytest.mark.parametrize("page", PAGES)
def test_with_auth_off_it_is_open(client, db, page):
    assert client.get(page).status_code == 200
