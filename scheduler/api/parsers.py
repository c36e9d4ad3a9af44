"""The one body format the DRF views take: JSON, with a body nested too deeply for Python's
parser, or text the database cannot keep, refused as bad input instead of failing as a
server error."""

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        from .errors import too_deep  # not at import: DRF's settings import this module
        from .fields import check_text

        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(too_deep().message) from None
        check_text(data)  # what the database could not keep is refused here
        return data
