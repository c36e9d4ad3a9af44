"""The watch URL's token: the request's id signed with the site's key (HMAC-SHA256, salted
for this use), so only whoever was given the URL can open the page, without a login. Its
URLs (`X-Switchyard-Watch-Url`, the jobs API's `watch_url`) are `access.watch`'s."""

from uuid import UUID

from django.core import signing

SALT = "switchyard.watch"


def signer() -> signing.Signer:
    return signing.Signer(salt=SALT, algorithm="sha256")


def token_for(request_id) -> str:
    return signer().sign(str(request_id))


def request_id_for(token: str) -> UUID | None:
    try:
        return UUID(signer().unsign(token))
    except (signing.BadSignature, ValueError, TypeError):
        return None
