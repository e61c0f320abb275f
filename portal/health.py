"""Checks behind /healthz: each answers (ok, detail) and never raises."""

import threading
import time

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection
from django.utils import timezone

from portal.celery import WATCHED_TASKS
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


# A probe may ask every second, from every load balancer: the broker is asked at most once per BROKER_CHECK_SECONDS
# per process, and by one request at a time (the others wait for its answer). Keyed by the broker's URL, so a
# process that changes broker asks the new one at once.
BROKER_CHECK_SECONDS = 5.0
_broker_answer: dict[str, tuple[float, tuple[bool, str]]] = {}
_broker_lock = threading.Lock()


def check_broker() -> tuple[bool, str]:
    url = str(celery_app.conf.broker_url)
    with _broker_lock:
        kept = _broker_answer.get(url)
        if kept is not None and time.monotonic() - kept[0] < BROKER_CHECK_SECONDS:
            return kept[1]
        answer = _connect_to_broker()
        _broker_answer.clear()  # one URL at a time: the map never grows
        _broker_answer[url] = (time.monotonic(), answer)
        return answer


def _connect_to_broker() -> tuple[bool, str]:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            transport = conn.transport_cls
    except Exception as exc:
        return False, type(exc).__name__
    return True, str(transport)


CHECKS = {"database": check_database, "cache": check_cache, "broker": check_broker}


# A watched task is late when its last run is older than three of its periods and half a minute: beat stopped, or
# no worker takes its tasks. It does not make /healthz answer 503 (the pages are served all the same, and a load
# balancer taking every web process out for it would stop the site too); the body says it, for monitoring.
LATE_PERIODS, LATE_MARGIN_SECONDS = 3, 30


def check_schedule() -> tuple[bool, str]:
    from portal.models import ScheduledRun

    try:
        last = dict(ScheduledRun.objects.filter(task__in=WATCHED_TASKS).values_list("task", "finished_at"))
    except DatabaseError as exc:
        return False, type(exc).__name__
    now, late = timezone.now(), []
    for name in WATCHED_TASKS:
        period = float(settings.CELERY_BEAT_SCHEDULE[name]["schedule"])
        if name not in last:
            late.append(f"{name} never ran")
        elif (age := (now - last[name]).total_seconds()) > LATE_PERIODS * period + LATE_MARGIN_SECONDS:
            late.append(f"{name} last ran {age:.0f} s ago, every {period:g} s")
    return not late, "; ".join(late) or "on time"
