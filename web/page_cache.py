"""A shared cache of the booking page's rendered HTML, for the anonymous GETs every visitor makes first.

The page only changes when availability or the catalog does, which booking counts as one generation
(booking/availability.py): every cached page carries the generation it was rendered at, so a stale page is never
served after a change. Entries also expire after `PAGE_TTL` seconds, which bounds the drift of time-based content
(the earliest bookable date).

The CSRF token differs per visitor: pages are rendered with a placeholder that is replaced on the way out.
"""

from collections.abc import Callable
from types import MappingProxyType

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token

from booking.availability import TTL as PAGE_TTL
from booking.availability import lookup

PLACEHOLDER_MARK = "__binome_"  # every placeholder starts so: text from a request that has it is not shared
CSRF_PLACEHOLDER = f"{PLACEHOLDER_MARK}csrf_token__"
CSRF_PLACEHOLDER_BYTES = CSRF_PLACEHOLDER.encode()


# Rendered into a shared page instead of the visitor's CSRF token; `for_visitor` puts theirs back.
SHARED_CONTEXT = MappingProxyType({"csrf_token": CSRF_PLACEHOLDER})


def for_visitor(request: HttpRequest, body: bytes) -> bytes:
    """A shared page (or block) with this visitor's CSRF token in place of the placeholder."""
    return body.replace(CSRF_PLACEHOLDER_BYTES, get_token(request).encode())


def cached_page(request: HttpRequest, *, key: str, render: Callable[[dict], HttpResponse]) -> HttpResponse:
    """`render(extra_context)` renders the page; `extra_context` replaces the CSRF token by a placeholder.

    One cache round trip on a hit: the page is stored with the generation it was rendered at, and both are
    fetched together.
    """
    page_key = f"booking:page:{request.LANGUAGE_CODE}:{key}"
    current, text = lookup(page_key)
    if text is None:
        response = render(dict(SHARED_CONTEXT))
        if response.status_code != 200:
            return response
        body = response.content
        # The shared cache holds JSON: the page as text (the portal's pages are UTF-8).
        cache.set(page_key, [current, body.decode(response.charset)], timeout=PAGE_TTL)
    else:
        body = text.encode(settings.DEFAULT_CHARSET)
    response = HttpResponse(for_visitor(request, body))
    response["Vary"] = "Cookie, Accept-Language"
    return response
