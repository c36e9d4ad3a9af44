"""Daphne's HTTP requests without Twisted's parsing of HTML form posts.

Twisted reads a POST's Content-Type through the `email` package, to fill `request.args`
for form submissions, before daphne hands the request on: 0.33 ms of CPU per request on
this 2-core machine, measured, a sixth of all the web process does for an inference call.
Daphne never reads those args (the ASGI app gets the raw body), and Twisted's Request takes
`parsePOSTFormSubmission=False` for exactly this case. Daphne builds its requests from the
module's `WebRequest`, so that name is what changes."""

from daphne import http_protocol


class RequestWithoutFormParsing(http_protocol.WebRequest):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)


def install() -> None:
    http_protocol.WebRequest = RequestWithoutFormParsing
