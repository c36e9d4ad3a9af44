"""The admin through the test client, for the admin tests of every app."""

from django.test import Client


def act(client: Client, changelist: str, action: str, pks: list[int]) -> str:
    """Run an admin action on a list page; returns the messages shown on the page it lands on."""
    response = client.post(changelist, {"action": action, "_selected_action": pks}, follow=True)
    assert response.status_code == 200
    return "\n".join(str(m) for m in response.context["messages"])


def assert_renders_with_each_filter(client: Client, changelist: str, filters: list[str]) -> None:
    """The list page renders unfiltered and with each filter, without an error note."""
    for query in ["", *filters]:
        response = client.get(f"{changelist}?{query}")
        assert response.status_code == 200, query
        assert "errornote" not in response.content.decode(), query
