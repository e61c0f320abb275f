"""URL converters for the parts of an order's address, so that a malformed one is a 404 before any query.

A `str` converter passes whatever the path holds, a NUL byte included, to the database, which refuses it: a 500,
mailed to ADMINS, for anyone's one GET. The order number (BN-XXXXXXXX) and the token (`secrets.token_urlsafe`) are
URL-safe base64 characters; an invoice number (PREFIX-YEAR-SEQUENCE, the prefix set by the operator) anything but
a slash or a control character.
"""

from django.urls import register_converter


class LinkPartConverter:
    """An order number or an order token: letters, digits, `-` and `_`."""

    regex = r"[A-Za-z0-9_-]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class PrintableConverter(LinkPartConverter):
    """Any text without a slash or a control character (NUL among them)."""

    regex = r"[^/\x00-\x1f\x7f]+"


register_converter(LinkPartConverter, "linkpart")
register_converter(PrintableConverter, "printable")
