"""The shared cache answers as an empty cache while Redis is unreachable, and as Redis itself otherwise."""

import html
import json
import os
import pickle
import re

import pytest
import redis
from django.core.cache import cache as django_cache
from django.test import RequestFactory
from django.urls import reverse
from django_ratelimit.core import is_ratelimited

from infrastructure.cache import ResilientRedisCache
from tests.payments.conftest import free_port


def redis_cache(url: str) -> ResilientRedisCache:
    return ResilientRedisCache(url, {"OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2}})


def test_with_redis_down_reads_miss_writes_are_dropped_and_nothing_raises():
    cache = redis_cache(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    assert cache.get("key", "default") == "default"
    assert cache.get_many(["a", "b"]) == {}
    cache.set("key", "value")
    assert cache.get_or_set("qr", lambda: "<svg/>") == "<svg/>"  # computed, not stored
    assert cache.add("counter", 1) is True
    with pytest.raises(ValueError):
        cache.incr("counter")
    assert cache.delete("key") is False and cache.has_key("key") is False


def test_with_redis_up_it_is_an_ordinary_redis_cache():
    cache = redis_cache(os.environ["REDIS_URL"])
    cache.set("resilient:test", {"a": 1})
    assert cache.get("resilient:test") == {"a": 1}
    assert cache.add("resilient:test", 2) is False
    cache.set("resilient:counter", 1)
    assert cache.incr("resilient:counter") == 2
    with pytest.raises(ValueError):
        cache.incr("resilient:missing")
    cache.delete_many(["resilient:test", "resilient:counter"])


def test_get_many_reads_in_one_command_and_survives_a_dropped_connection():
    """get_many sends its MGET on a pooled connection itself (infrastructure/cache.py): misses are left out, and a
    connection the server closed meanwhile is replaced when it is handed out, not answered as a miss."""
    cache = redis_cache(os.environ["REDIS_URL"])
    cache.set_many({"resilient:one": 1, "resilient:two": ["b", "\x00"]})
    assert cache.get_many(["resilient:one", "resilient:none", "resilient:two"]) == {
        "resilient:one": 1,
        "resilient:two": ["b", "\x00"],
    }

    pooled = cache._cache.get_client().client_id()  # the one idle connection of the pool
    redis.Redis.from_url(os.environ["REDIS_URL"]).client_kill_filter(_id=pooled)
    assert cache.get_many(["resilient:one"]) == {"resilient:one": 1}
    cache.delete_many(["resilient:one", "resilient:two"])


def test_rate_limits_fail_open_while_the_cache_is_down(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "infrastructure.cache.ResilientRedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
        }
    }
    request = RequestFactory().post("/")
    assert not any(
        is_ratelimited(request, group="test", key="ip", rate="1/h", method="POST", increment=True) for _ in range(5)
    )


# --- JSON, not pickles ----------------------------------------------------------------------------------------


class _WritesAFile:
    """What an attacker with write access to Redis would plant: unpickling it runs code (here: creates a file)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _raw(key: str) -> bytes | None:
    return redis.Redis.from_url(os.environ["REDIS_URL"]).get(django_cache.make_and_validate_key(key))


def test_the_portal_cache_stores_json_that_any_redis_client_reads_as_text():
    django_cache.set("json:probe", {"versions": ["a1", "b2"], "label": "Binôme", "ready": True}, timeout=60)

    raw = _raw("json:probe")
    assert not raw.startswith(b"\x80")  # a pickle starts with its protocol byte
    assert json.loads(raw) == {"versions": ["a1", "b2"], "label": "Binôme", "ready": True}
    assert django_cache.get("json:probe") == {"versions": ["a1", "b2"], "label": "Binôme", "ready": True}
    django_cache.set("json:counter", 41)
    assert _raw("json:counter") == b"41" and django_cache.incr("json:counter") == 42  # INCR still works


def test_what_json_cannot_hold_is_refused_at_the_write_not_pickled():
    with pytest.raises(TypeError):
        django_cache.set("json:bytes", b"<p>")
    with pytest.raises(TypeError):
        django_cache.set("json:object", object())
    assert _raw("json:bytes") is None and _raw("json:object") is None


def test_a_pickle_planted_in_redis_is_never_unpickled(tmp_path):
    # given: someone who can write to Redis replaces a cached entry with a pickle that runs code when loaded
    marker = tmp_path / "pwned"
    redis.Redis.from_url(os.environ["REDIS_URL"]).set(
        django_cache.make_and_validate_key("booking:generation"), pickle.dumps(_WritesAFile(marker))
    )
    # when: the portal reads it, alone or with others
    assert django_cache.get("booking:generation", "default") is None
    assert django_cache.get_many(["booking:generation"]).get("booking:generation") is None
    # then: it was read as a miss (not JSON), and nothing ran
    assert not marker.exists()


@pytest.mark.django_db
def test_every_value_the_pages_and_the_payments_cache_is_json(client, catalog, booking_data):
    """The booking page (shared page, catalog generation, availability hint), an order placed and its page
    (status versions, the rendering record, the QR code), a poll, and the rate-limit counters: every entry they
    leave in Redis is JSON (or a Redis integer)."""
    from tests.builders.orders import order_url, place

    assert client.get(reverse("customer:book")).status_code == 200
    order, token = place(client, booking_data())
    page = client.get(order_url(order, token))
    assert page.status_code == 200
    poll = re.search(r'hx-get="([^"]+\?v=[0-9a-f]{16}[^"]*)"', page.content.decode())
    assert poll, "the order page polls its status block"
    client.get(html.unescape(poll[1]), headers={"HX-Request": "true"})

    server = redis.Redis.from_url(os.environ["REDIS_URL"])
    keys = server.keys("*")
    assert len(keys) >= 5, keys  # the flow above did cache things
    for key in keys:
        raw = server.get(key)
        if raw is None or re.fullmatch(rb"-?[0-9]+", raw):
            continue
        try:
            json.loads(raw)
        except ValueError:
            pytest.fail(f"{key!r} holds {raw[:60]!r}, not JSON")
