"""The shared cache answers as an empty cache while Redis is unreachable, and as Redis itself otherwise."""

import os

import pytest
import redis
from django.test import RequestFactory
from django_ratelimit.core import is_ratelimited

from portal.cache import ResilientRedisCache
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
    """get_many sends its MGET on a pooled connection itself (portal/cache.py): misses are left out, and a
    connection the server closed meanwhile is replaced when it is handed out, not answered as a miss."""
    cache = redis_cache(os.environ["REDIS_URL"])
    cache.set_many({"resilient:one": 1, "resilient:two": ("b", b"\x00")})
    assert cache.get_many(["resilient:one", "resilient:none", "resilient:two"]) == {
        "resilient:one": 1,
        "resilient:two": ("b", b"\x00"),
    }

    pooled = cache._cache.get_client().client_id()  # the one idle connection of the pool
    redis.Redis.from_url(os.environ["REDIS_URL"]).client_kill_filter(_id=pooled)
    assert cache.get_many(["resilient:one"]) == {"resilient:one": 1}
    cache.delete_many(["resilient:one", "resilient:two"])


def test_rate_limits_fail_open_while_the_cache_is_down(settings):
    settings.CACHES = {
        "default": {"BACKEND": "portal.cache.ResilientRedisCache", "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}
    }
    request = RequestFactory().post("/")
    assert not any(
        is_ratelimited(request, group="test", key="ip", rate="1/h", method="POST", increment=True) for _ in range(5)
    )
