"""/healthz tells a load balancer what is down; /livez only that the process answers."""

import re
import subprocess
import time
from datetime import timedelta

import pytest
import redis
from django.test import Client

from portal import health
from portal.celery import app as celery_app
from tests.payments.conftest import free_port


@pytest.mark.django_db
def test_healthz_reports_database_cache_and_broker_up(client, settings):
    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"] == {"ok": True, "detail": "postgresql"}
    assert body["checks"]["cache"]["ok"] is True
    assert body["checks"]["broker"] == {"ok": True, "detail": "redis"}


@pytest.mark.django_db
def test_healthz_says_503_and_which_part_is_down_when_the_broker_is_unreachable(client):
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        response = client.get("/healthz")
    finally:
        celery_app.conf.broker_url = original

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["broker"]["ok"] is False
    assert body["checks"]["database"]["ok"] is True


def test_livez_answers_without_the_database(client):
    response = client.get("/livez")
    assert response.status_code == 200 and response.content == b"ok"


def test_healthz_refuses_other_methods(client):
    assert client.post("/healthz").status_code == 405


# --- who sees what ----------------------------------------------------------------------------------------------

PUBLIC = "203.0.113.40"


@pytest.fixture
def broker_down():
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    yield
    celery_app.conf.broker_url = original


def _plain(response, status: int, word: str) -> None:
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/plain") and response.content.decode() == word


@pytest.mark.django_db
def test_a_stranger_gets_the_status_alone_without_what_the_portal_runs_on(broker_down):
    stranger = Client(REMOTE_ADDR=PUBLIC)

    response = stranger.get("/healthz")

    _plain(response, 503, "unavailable")
    assert b"broker" not in response.content and b"postgresql" not in response.content


@pytest.mark.django_db
def test_a_stranger_behind_a_proxy_on_the_same_machine_is_still_a_stranger(settings):
    """gunicorn behind a local nginx sees every client come from loopback: the forwarded address decides."""
    settings.TRUSTED_PROXY_COUNT = 1
    relayed = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=PUBLIC)
    _plain(relayed.get("/healthz"), 200, "ok")

    settings.TRUSTED_PROXY_COUNT = 0  # even with the proxy undeclared, a relayed request gets no details
    _plain(relayed.get("/healthz"), 200, "ok")


@pytest.mark.django_db
def test_a_signed_in_customer_account_without_staff_rights_is_a_stranger(django_user_model):
    member = Client(REMOTE_ADDR=PUBLIC)
    member.force_login(django_user_model.objects.create_user("ada", password="long-enough-password-1"))
    _plain(member.get("/healthz"), 200, "ok")


@pytest.mark.django_db
def test_an_operator_signed_in_sees_which_part_is_down_from_anywhere(django_user_model, broker_down):
    operator = Client(REMOTE_ADDR=PUBLIC)
    operator.force_login(django_user_model.objects.create_user("olga", password="long-enough-1", is_staff=True))

    response = operator.get("/healthz")

    assert response.status_code == 503
    assert response.json()["checks"]["broker"]["ok"] is False and response.json()["checks"]["database"]["ok"]


@pytest.mark.django_db
def test_a_probe_on_the_machine_itself_sees_the_details():
    response = Client(REMOTE_ADDR="::1").get("/healthz")
    assert response.status_code == 200 and response.json()["checks"]["database"]["detail"] == "postgresql"


@pytest.mark.django_db
def test_with_the_https_redirect_on_a_plain_http_probe_still_gets_the_health_pages_and_nothing_else(settings):
    settings.SECURE_SSL_REDIRECT = True  # production with an https SITE_URL
    probe = Client(REMOTE_ADDR="127.0.0.1")  # gunicorn's own port, no proxy: plain http

    assert probe.get("/healthz").json()["checks"]["database"]["ok"] is True
    assert probe.get("/livez").status_code == 200
    assert probe.get("/healthz/x").status_code == 301  # the exemption is the two pages, not a prefix
    assert probe.get("/").status_code == 301


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of this test's own as the broker, to count the connections made to it."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = f"redis://127.0.0.1:{port}/0"
    yield client
    celery_app.conf.broker_url = original
    process.terminate()
    process.wait(timeout=10)


def _connections_received(server: redis.Redis) -> int:
    return server.info("stats")["total_connections_received"] - 1  # less this very INFO's connection, kept open


@pytest.mark.django_db
def test_a_flood_of_health_probes_asks_the_broker_once_every_few_seconds(own_redis, monkeypatch):
    stranger = Client(REMOTE_ADDR=PUBLIC)
    before = _connections_received(own_redis)

    statuses = [stranger.get("/healthz").status_code for _ in range(30)]

    assert statuses == [200] * 30
    assert _connections_received(own_redis) - before == 1
    monkeypatch.setattr(health, "BROKER_CHECK_SECONDS", 0.0)  # once that time has passed, it asks again
    stranger.get("/healthz")
    assert _connections_received(own_redis) - before == 2


# --- beat and the workers: the watched tasks' last runs ----------------------------------------------------------


@pytest.mark.integration
def test_a_worker_s_runs_of_the_scan_and_the_sweep_make_the_schedule_on_time(client, celery_worker_process):
    from portal.models import ScheduledRun

    before = client.get("/healthz").json()
    assert before["schedule"] == {
        "ok": False,
        "detail": "payments.scan_chains never ran; provisioning.lifecycle_tick never ran",
    }
    for name in ("payments.scan_chains", "provisioning.lifecycle_tick"):
        celery_app.send_task(name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ScheduledRun.objects.count() < 2:
        time.sleep(0.2)

    after = client.get("/healthz")
    assert after.status_code == 200 and after.json()["schedule"] == {"ok": True, "detail": "on time"}


@pytest.mark.django_db
def test_a_late_sweep_is_said_without_a_503_and_an_in_process_run_is_not_counted(client, settings):
    from django.utils import timezone

    from portal.models import ScheduledRun
    from provisioning.tasks import lifecycle_tick

    settings.CELERY_BEAT_SCHEDULE = {
        **settings.CELERY_BEAT_SCHEDULE,
        "provisioning.lifecycle_tick": {"task": "provisioning.lifecycle_tick", "schedule": 30.0},
    }
    now = timezone.now()
    ScheduledRun.objects.create(task="payments.scan_chains", finished_at=now)
    ScheduledRun.objects.create(task="provisioning.lifecycle_tick", finished_at=now - timedelta(seconds=600))

    response = client.get("/healthz")

    assert response.status_code == 200 and response.json()["status"] == "ok"  # the pages are served all the same
    schedule = response.json()["schedule"]
    assert not schedule["ok"] and re.fullmatch(
        r"provisioning\.lifecycle_tick last ran 60\d s ago, every 30 s", schedule["detail"]
    )
    lifecycle_tick.delay()  # eager, in this process: not a worker's run
    assert ScheduledRun.objects.get(task="provisioning.lifecycle_tick").finished_at < now
    assert Client(REMOTE_ADDR=PUBLIC).get("/healthz").content == b"ok"  # a stranger learns nothing of it
