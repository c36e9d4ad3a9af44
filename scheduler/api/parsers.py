"""The one body format the DRF views take: JSON, with a body nested too deeply for Python's
parser refused as bad input instead of failing as a server error."""

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            from .errors import too_deep  # not at import: DRF's settings import this module

            raise ParseError(too_deep().message) from None
