"""What can be booked, as one generation counter: every booking, release, reassignment, extension and catalog
or fleet edit bumps it (on commit), and whatever is computed from availability or the catalog is kept in the
shared cache with the generation it was computed at, so nothing stale is served after a change.

Booking's availability hint (placing._availability_hint) is kept so; the presentation layer keys its cached copies
of the booking page by the same generation (web/page_cache.py). Entries also expire after `TTL` seconds, which
bounds the drift of time-based content (the earliest date).

The shared cache holds JSON only (infrastructure/cache.py): `remember` takes values JSON can write. Model instances (the
catalog the booking page draws from, the current terms) are kept by `remember_in_process` instead: in the memory of
each process, under the same shared generation, so a change made by any process is seen by all at their next read.
"""

import pickle
import secrets
import threading
import time
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
        cache.set(key, [current, value], timeout=timeout)
    return value


# key: (generation, monotonic expiry, pickled value). A few fixed keys (the catalog, the terms), never one per request.
_in_process: dict[str, tuple[int, float, bytes]] = {}
_in_process_lock = threading.Lock()


def remember_in_process(key: str, compute: Callable[[], T], *, timeout: int = TTL) -> T:
    """`remember` for what the shared cache cannot hold (model instances): kept in this process's memory, valid
    while the shared generation is the one it was computed at and at most `timeout` seconds. One cache read per
    call, as `remember`. Each caller gets its own copy: nothing one request changes on it reaches another. A pickle
    copies what a deep copy would drop (the prefetched rows of a queryset); it never leaves this process's memory.
    `key` must be one of a few fixed names: entries are not evicted, only replaced."""
    current = generation()
    with _in_process_lock:
        kept = _in_process.get(key)
    if kept is not None and kept[0] == current and kept[1] > time.monotonic():
        return pickle.loads(kept[2])  # noqa: S301 (written by this process, in its own memory)
    value = compute()
    with _in_process_lock:
        _in_process[key] = (current, time.monotonic() + timeout, pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    return value


def changed(**kwargs) -> None:
    """A receiver for saves and deletes of what can be booked (booking/apps.py and the apps that own hosts)."""
    bump_generation()
