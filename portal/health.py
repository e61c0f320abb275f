"""Checks behind /healthz: each answers (ok, detail) and never raises."""

import time

from django.core.cache import cache
from django.db import connection

from portal.celery import app as celery_app


def check_database() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "down" to a load balancer
        return False, type(exc).__name__
    return True, connection.vendor


def check_cache() -> tuple[bool, str]:
    key = "healthz:probe"
    try:
        value = str(time.monotonic_ns())
        cache.set(key, value, timeout=10)
        if cache.get(key) != value:
            return False, "read back a different value"
    except Exception as exc:
        return False, type(exc).__name__
    return True, cache.__class__.__name__


def check_broker() -> tuple[bool, str]:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            transport = conn.transport_cls
    except Exception as exc:
        return False, type(exc).__name__
    return True, str(transport)


CHECKS = {"database": check_database, "cache": check_cache, "broker": check_broker}
