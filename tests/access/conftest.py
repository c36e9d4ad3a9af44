import pytest

from access import auth
from access.models import ApiKey


@pytest.fixture
def make_key(db):
    """`make_key("alice", rpm=2)` -> (ApiKey, its secret)."""
    auth.forget()

    def make(name: str = "app", **fields) -> tuple[ApiKey, str]:
        api_key, secret = ApiKey.generate(name, **fields)
        api_key.save()
        return api_key, secret

    yield make
    auth.forget()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}
