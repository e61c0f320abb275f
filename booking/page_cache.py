"""A shared cache of the booking page's rendered HTML, for the anonymous GETs every visitor makes first.

The page only changes when availability or the catalog does: every such change bumps one generation counter
(on commit of bookings and releases, and on admin edits of the catalog), and every cached page carries the
generation it was rendered at, so a stale page is never served after a change. Entries also expire after
`PAGE_TTL` seconds, which bounds the drift of time-based content (the earliest bookable date).

The CSRF token differs per visitor: pages are rendered with a placeholder that is replaced on the way out.
"""

import secrets
from collections.abc import Callable
from types import MappingProxyType
from typing import TypeVar

from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token

GENERATION_KEY = "booking:generation"
PAGE_TTL = 60
PLACEHOLDER_MARK = "__binome_"  # every placeholder starts so: text from a request that has it is not shared
CSRF_PLACEHOLDER = f"{PLACEHOLDER_MARK}csrf_token__"
CSRF_PLACEHOLDER_BYTES = CSRF_PLACEHOLDER.encode()


T = TypeVar("T")

# Rendered into a shared page instead of the visitor's CSRF token; `for_visitor` puts theirs back.
SHARED_CONTEXT = MappingProxyType({"csrf_token": CSRF_PLACEHOLDER})


def for_visitor(request: HttpRequest, body: bytes) -> bytes:
    """A shared page (or block) with this visitor's CSRF token in place of the placeholder."""
    return body.replace(CSRF_PLACEHOLDER_BYTES, get_token(request).encode())


def _fresh_generation() -> int:
    # Random rather than 1: a counter evicted and set again must not match what was cached before it.
    return secrets.randbits(48)


def generation() -> int:
    return cache.get_or_set(GENERATION_KEY, _fresh_generation, timeout=None)


def bump_generation() -> None:
    """Invalidate every cached page, once the current transaction (if any) commits."""
    transaction.on_commit(_bump)


def _bump() -> None:
    try:
        cache.incr(GENERATION_KEY)
    except ValueError:  # the counter was evicted: any new value invalidates the old pages
        cache.set(GENERATION_KEY, _fresh_generation(), timeout=None)


def _lookup(key: str) -> tuple[int, object | None]:
    """The current generation, and what `key` holds if it was stored at that generation (one round trip)."""
    found = cache.get_many([GENERATION_KEY, key])
    current = found.get(GENERATION_KEY)
    if current is None:
        current = generation()
    cached = found.get(key)
    if cached is not None and cached[0] == current:
        return current, cached[1]
    return current, None


def remember(key: str, compute: Callable[[], T], *, timeout: int = PAGE_TTL) -> T:
    """`compute()`, kept in the shared cache while availability and the catalog stay as they were (the same
    generation) and at most `timeout` seconds. The generation is read before computing: a change committed
    meanwhile makes the value stale at once, never served as current."""
    current, value = _lookup(key)
    if value is None:
        value = compute()
        cache.set(key, (current, value), timeout=timeout)
    return value


def cached_page(request: HttpRequest, *, key: str, render: Callable[[dict], HttpResponse]) -> HttpResponse:
    """`render(extra_context)` renders the page; `extra_context` replaces the CSRF token by a placeholder.

    One cache round trip on a hit: the page is stored with the generation it was rendered at, and both are
    fetched together.
    """
    page_key = f"booking:page:{request.LANGUAGE_CODE}:{key}"
    current, body = _lookup(page_key)
    if body is None:
        response = render(dict(SHARED_CONTEXT))
        if response.status_code != 200:
            return response
        body = response.content
        cache.set(page_key, (current, body), timeout=PAGE_TTL)
    response = HttpResponse(for_visitor(request, body))
    response["Vary"] = "Cookie, Accept-Language"
    return response
