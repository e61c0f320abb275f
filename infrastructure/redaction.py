"""Order tokens stay out of logs, error reports and the events sent to Sentry; and from Sentry's events, the
customers' e-mail addresses and the paths and queries of the URLs the portal calls (an RPC provider's API key).

An order's secret link is /orders/<number>/<token>/…, and its status poll is the same path with `?v=`. Whatever
writes a request's path somewhere (gunicorn's access log, Django's "Not Found: /…" and "Internal Server Error:
/…", the error report mailed to ADMINS) goes through `redact`, which keeps the number and replaces the token.
"""

import logging
import re
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

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


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


# An e-mail address, as an SMTP refusal or a log line quotes a customer's (send_default_pii is off, but an
# exception's message is the exception's): replaced in what Sentry is sent.
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})+", re.ASCII)
EMAIL_REDACTED = "[email]"


def _origin(url: str) -> str:
    """A URL's scheme, host and port only: an RPC provider's API key is in its path or its query, a password in
    its user part."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "[url]"
    return f"{parts.scheme}://{parts.hostname or ''}{port}" if parts.scheme else "[url]"


def _outgoing_request(item: dict) -> dict:
    """Sentry's breadcrumb (`type` http) or span (`op` http.client) of a request the portal made, down to the
    server it went to: the SDK writes its whole URL, query apart."""
    data = dict(item.get("data") or {})
    origin = _origin(str(data.get("url", "")))
    data["url"] = origin
    for name in ("http.query", "http.fragment"):
        data.pop(name, None)
    item = {**item, "data": data}
    if "description" in item:
        item["description"] = f"{data.get('http.method', data.get('method', ''))} {origin}".strip()
    return item


def _replaced(value, tokens: set[str]):
    if isinstance(value, str):
        value = _EMAIL.sub(EMAIL_REDACTED, redact(value))
        for token in tokens:
            value = value.replace(token, REDACTED)
        return value
    if isinstance(value, dict):
        if value.get("type") == "http" or str(value.get("op", "")).startswith("http.client"):
            value = _outgoing_request(value)
        return {_replaced(key, tokens): _replaced(item, tokens) for key, item in value.items()}
    if isinstance(value, list | tuple):
        replaced = [_replaced(item, tokens) for item in value]
        return replaced if isinstance(value, list) else tuple(replaced)
    return value


def redact_event(event: dict, hint: dict | None = None) -> dict:
    """Sentry's `before_send`, `before_send_transaction` and `before_breadcrumb`: the event (or breadcrumb) with
    every order link's token replaced in every string of it, keys included (URL, query string, headers, exception
    values, log messages and their arguments, breadcrumbs, a task's arguments), and each token seen in a link also
    replaced where it stands alone (an exception's message, a span's data), as RedactingExceptionReporter does with
    the request's. A token never written in a link anywhere in the event has no shape to be found by: the settings
    keep frame variables and request bodies out of the events altogether. E-mail addresses are replaced too, and
    the requests the portal made (to RPC providers, whose URLs hold API keys) keep only the server's address."""
    tokens = set()
    for text in _strings(event):
        for link in _ORDER_LINK.finditer(text):
            token = link.group(0)[len(link.group(1)) :]
            tokens |= {spelled for spelled in (token, unquote(token)) if len(spelled) >= 8}
    return _replaced(event, tokens)


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
