"""What can be booked, as one generation counter: every booking, release, reassignment, extension and catalog
or fleet edit bumps it (on commit), and whatever is computed from availability or the catalog is kept in the
shared cache with the generation it was computed at, so nothing stale is served after a change.

Booking's availability hint (placing._availability_hint) and the catalog the booking page draws from are kept so;
the presentation layer keys its cached copies of the booking page by the same generation (web/page_cache.py).
Entries also expire after `TTL` seconds, which bounds the drift of time-based content (the earliest date).
"""

import secrets
from collections.abc import Callable
from typing import TypeVar

from django.core.cache import cache
from django.db import transaction

GENERATION_KEY = "booking:generation"
TTL = 60

T = TypeVar("T")


def _fresh_generation() -> int:
    # Random rather than 1: a counter evicted and set again must not match what was cached before it.
    return secrets.randbits(48)


def generation() -> int:
    return cache.get_or_set(GENERATION_KEY, _fresh_generation, timeout=None)


def bump_generation() -> None:
    """Availability or the catalog changed: what was kept is stale, once the current transaction (if any) commits."""
    transaction.on_commit(_bump)


def _bump() -> None:
    try:
        cache.incr(GENERATION_KEY)
    except ValueError:  # the counter was evicted: any new value invalidates the old pages
        cache.set(GENERATION_KEY, _fresh_generation(), timeout=None)


def lookup(key: str) -> tuple[int, object | None]:
    """The current generation, and what `key` holds if it was stored at that generation (one round trip)."""
    found = cache.get_many([GENERATION_KEY, key])
    current = found.get(GENERATION_KEY)
    if current is None:
        current = generation()
    cached = found.get(key)
    if cached is not None and cached[0] == current:
        return current, cached[1]
    return current, None


def remember(key: str, compute: Callable[[], T], *, timeout: int = TTL) -> T:
    """`compute()`, kept in the shared cache while availability and the catalog stay as they were (the same
    generation) and at most `timeout` seconds. The generation is read before computing: a change committed
    meanwhile makes the value stale at once, never served as current."""
    current, value = lookup(key)
    if value is None:
        value = compute()
        cache.set(key, (current, value), timeout=timeout)
    return value


def changed(**kwargs) -> None:
    """A receiver for saves and deletes of what can be booked (booking/apps.py and the apps that own hosts)."""
    bump_generation()
