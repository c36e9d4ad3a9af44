"""Daphne hands the app every body as it came: Twisted does not parse form posts first."""

import httpx
import pytest


@pytest.mark.django_db(transaction=True)
def test_a_form_post_reaches_the_api_as_it_came(served):
    """A malformed multipart body: Twisted, parsing it, would answer its own bare 400 page;
    here the API answers, in the OpenAI shape."""
    switchyard = served()
    response = httpx.post(
        f"{switchyard.url}/v1/chat/completions",
        content=b"model=m1",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
