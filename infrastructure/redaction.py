"""Order tokens stay out of logs and error reports.

An order's secret link is /orders/<number>/<token>/…, and its status poll is the same path with `?v=`. Whatever
writes a request's path somewhere (gunicorn's access log, Django's "Not Found: /…" and "Internal Server Error:
/…", the error report mailed to ADMINS) goes through `redact`, which keeps the number and replaces the token.
"""

import logging
import re

from django.views.debug import ExceptionReporter
from gunicorn.glogging import Logger

# /orders/<number>/<token>, in every spelling that Django routes to the order: the whole link percent-encoded (a
# `next=` parameter), and any character of it percent-escaped (`BN%2D…`, a token whose `-` a mail gateway escaped),
# since Django decodes the path before routing. The classes exclude the separators, so the pattern runs in one pass.


def _spelled(character: str) -> str:
    """`character` as written or percent-escaped (either case of hex digits)."""
    high, low = f"{ord(character):02X}"
    return f"(?:{re.escape(character)}|%{high}{low if low.isdigit() else f'[{low}{low.lower()}]'})"


_SLASH = _spelled("/")
_ESCAPE = r"%(?!2[fF])[0-9A-Fa-f]{2}"  # a percent-escape of anything but a slash
_ORDER_LINK = re.compile(
    rf"({_SLASH}{''.join(_spelled(c) for c in 'orders')}{_SLASH}(?:[^/%\s?#&]|{_ESCAPE})+{_SLASH})"
    rf"(?:[^/%\s?#&\"'<>]|{_ESCAPE})+"
)
REDACTED = "[token]"


def redact(text: str) -> str:
    return _ORDER_LINK.sub(r"\1" + REDACTED, text)


class RedactTokensFilter(logging.Filter):
    """On every handler: the formatted message and the traceback with order tokens replaced."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        if record.exc_info and not record.exc_text:  # the traceback: an exception's message may hold a link too
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


class RedactingExceptionReporter(ExceptionReporter):
    """Django's error report (the e-mail to ADMINS, the DEBUG page), with the request's order token removed
    wherever it appears: URL, META, frame variables."""

    def _redact(self, text: str) -> str:
        text = redact(text)
        match = getattr(self.request, "resolver_match", None)
        token = match.kwargs.get("token") if match else None
        return text.replace(token, REDACTED) if token and len(token) >= 8 else text

    def get_traceback_html(self):
        return self._redact(str(super().get_traceback_html()))

    def get_traceback_text(self):
        return self._redact(str(super().get_traceback_text()))


class RedactingGunicornLogger(Logger):
    """gunicorn's logs (`--logger-class`): the access log with order tokens replaced in the request line, path,
    query, referrer and headers; the error log ("Error handling request /orders/…", a worker's traceback) through
    the same filter as Django's loggers."""

    def setup(self, cfg):
        super().setup(cfg)
        if not any(isinstance(existing, RedactTokensFilter) for existing in self.error_log.filters):
            self.error_log.addFilter(RedactTokensFilter())

    def atoms(self, resp, req, environ, request_time):
        return {
            key: redact(value) if isinstance(value, str) else value
            for key, value in super().atoms(resp, req, environ, request_time).items()
        }
