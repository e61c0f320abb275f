"""/healthz tells a load balancer what is down; /livez only that the process answers."""

import pytest

from portal.celery import app as celery_app


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
