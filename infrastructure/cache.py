"""The shared cache, degraded rather than down when Redis is.

Everything the portal keeps in the cache can be recomputed or forgotten: rendered booking pages, QR codes,
rate-limit counters. A Redis outage must therefore not turn a researcher's "I've paid" or an order page into a
server error. `ResilientRedisCache` is Django's own RedisCache whose calls, when Redis cannot be reached, log
a warning and answer as an empty cache would: a miss on reads, nothing stored on writes, "added" on `add` (so
django-ratelimit fails open: a counter that cannot be kept limits no one) and "missing" on `incr`.

Only connection-level failures are absorbed; anything else (a wrong type, a bad argument) still raises.
`/healthz` still reports the cache down: it writes a probe and reads it back.

Values are stored as JSON (`JSONSerializer`), never as pickles: Django's default would make write access to Redis
code execution in every process that reads the cache, the worker holding the provisioning key among them. What
the portal caches is therefore plain data (text, numbers, lists, string-keyed dicts): a tuple comes back as a
list, and anything JSON cannot write (bytes, a model instance, a date) is refused at `set`, not stored.
"""

import functools
import json
import logging
import time

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError)
_WARN_EVERY_S = 10.0
_last_warning = 0.0


def _warn(operation: str, exc: Exception) -> None:
    global _last_warning
    now = time.monotonic()
    if now - _last_warning >= _WARN_EVERY_S:  # one line per ten seconds of outage, not one per request
        _last_warning = now
        logger.warning("cache unreachable, %s answered as an empty cache: %s", operation, exc)


def _degrade(on_failure):
    """Run the RedisCache method; when Redis is unreachable, return `on_failure(*args, **kwargs)` instead."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except UNREACHABLE as exc:
                _warn(method.__name__, exc)
                return on_failure(*args, **kwargs)

        return wrapper

    return decorate


class JSONSerializer:
    """Django's RedisSerializer without pickle: integers are stored as Redis integers (so that INCR works on them,
    as Django's does), everything else as compact JSON text. `dumps` raises TypeError on what JSON cannot hold."""

    def dumps(self, obj) -> bytes | int:
        # `type() is int`: a bool must come back as a bool, so it goes through JSON like any other value.
        if type(obj) is int:
            return obj
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def loads(self, data: bytes | int):
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except ValueError:  # not written by the portal (a planted pickle, say): read as a miss, never run
            logger.warning("cache entry that is not JSON read as a miss (%d bytes)", len(data))
            return None


def _missing_counter(key, *args, **kwargs):
    raise ValueError(f"Key '{key}' not found (the cache is unreachable)")


class ReusedClientRedisCacheClient(RedisCacheClient):
    """Django's client builds a new `redis.Redis` for every call, and redis-py spends about half a millisecond
    setting one up (its response callbacks): more than the round trip itself on loopback. A client is
    thread-safe (it takes a connection from its pool per command), so one per pool is kept and reused."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client

    def get_many(self, keys):
        """One MGET on a connection of the pool, without redis-py's per-command wrapper (its retry loop and
        metrics hooks cost about 30 us, a quarter of the round trip on loopback; the booking page and the status
        poll each make one such read). The pool still checks the connection it hands out and reconnects a stale
        one; a command that fails after that raises, and the cache answers as an empty one (a miss)."""
        pool = self._get_connection_pool(write=False)
        connection = pool.get_connection()
        try:
            connection.send_command("MGET", *keys)
            values = connection.read_response()
        except BaseException:
            connection.disconnect()  # what is left on the socket must not answer the next command
            raise
        finally:
            pool.release(connection)
        return {
            key: self._serializer.loads(value) for key, value in zip(keys, values, strict=True) if value is not None
        }


class ResilientRedisCache(RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusedClientRedisCacheClient
        # JSON unless the settings name another serializer: never Django's pickle by omission.
        self._options = {"serializer": JSONSerializer, **self._options}

    get = _degrade(lambda key, default=None, version=None: default)(RedisCache.get)
    get_many = _degrade(lambda keys, version=None: {})(RedisCache.get_many)
    has_key = _degrade(lambda *args, **kwargs: False)(RedisCache.has_key)
    set = _degrade(lambda *args, **kwargs: None)(RedisCache.set)
    set_many = _degrade(lambda data, *args, **kwargs: list(data))(RedisCache.set_many)
    add = _degrade(lambda *args, **kwargs: True)(RedisCache.add)
    touch = _degrade(lambda *args, **kwargs: False)(RedisCache.touch)
    delete = _degrade(lambda *args, **kwargs: False)(RedisCache.delete)
    delete_many = _degrade(lambda *args, **kwargs: None)(RedisCache.delete_many)
    incr = _degrade(_missing_counter)(RedisCache.incr)
    clear = _degrade(lambda *args, **kwargs: False)(RedisCache.clear)
