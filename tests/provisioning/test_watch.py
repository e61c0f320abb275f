"""The readings watched while the window runs: one card nearly idle while another is busy, or every card idle for
hours, said on the order page while it lasts and e-mailed as often as the researcher allows. The watch reads the
hosts' tools' figures only; gaps say nothing."""

from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse

from booking.models import AlertMails, OrderStatus
from provisioning import readings, watch
from provisioning.models import Access, GpuReading, OperatorSettings, WatchAlert
from tests.builders.orders import make_ready_order, order_url

pytestmark = pytest.mark.django_db

UNBALANCED = [[0, 97, 171234, 184320, 812.5, 71], [1, 3, 2210, 184320, 140.25, 38]]
BALANCED = [[0, 88, 150000, 184320, 700, 66], [1, 91, 151000, 184320, 705, 67]]
IDLE = [[0, 0, 2000, 184320, 90, 31], [1, 2, 2000, 184320, 91, 30]]


@pytest.fixture
def running(client, booking_data, admin_user, django_capture_on_commit_callbacks):
    """A running window (on the demo's dry-run host) and a writer of its minutes: write(minutes, gpus, start=)."""
    order, token = make_ready_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    order.status = OrderStatus.ACTIVE
    order.save(update_fields=["status"])
    access = order.accesses.get()
    Access.objects.filter(pk=access.pk).update(status=Access.Status.READY)
    start = order.starts_at

    def write(minutes: range, gpus: list, *, skip: set[int] = frozenset()) -> None:
        GpuReading.objects.bulk_create(
            GpuReading(access=access, taken_at=start + timedelta(minutes=minute), gpus=gpus)
            for minute in minutes
            if minute not in skip
        )

    return order, token, start, write


def _tick(start, minute: int, capture) -> int:
    with capture(execute=True):
        return watch.watch_readings(now=start + timedelta(minutes=minute))


def test_an_unbalanced_split_is_e_mailed_once_and_said_on_the_page_while_it_lasts(
    running, client, django_capture_on_commit_callbacks
):
    order, token, start, write = running
    mail.outbox.clear()
    write(range(29), UNBALANCED)
    assert _tick(start, 28, django_capture_on_commit_callbacks) == 0  # 29 minutes: not yet the operator's 30
    write(range(29, 40), UNBALANCED)
    assert _tick(start, 30, django_capture_on_commit_callbacks) == 1
    for minute in range(31, 40):  # it goes on: said once
        assert _tick(start, minute, django_capture_on_commit_callbacks) == 0
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == [order.contact_email] and "nearly idle, the other busy" in message.subject
    assert "GPU 1 on" in message.body and "has stayed nearly idle" in message.body and "GPU 0 on" in message.body
    assert "nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv" in message.body
    assert 'ps -u "$USER" -o pid,pcpu,etime,args' in message.body

    alert = WatchAlert.objects.get(order=order)
    assert alert.kind == "imbalance" and alert.ended_at is None and alert.started_at == start + timedelta(minutes=1)
    assert alert.idle_cards[0][1] == 1 and alert.busy_cards[0][1] == 0
    page = client.get(order_url(order, token)).content.decode()
    assert 'id="watch-imbalance"' in page and "One card nearly idle while another is busy" in page

    write(range(40, 41), BALANCED)  # balanced again: it ends, the page no longer says it
    _tick(start, 40, django_capture_on_commit_callbacks)
    alert.refresh_from_db()
    assert alert.ended_at is not None
    assert 'id="watch-imbalance"' not in client.get(order_url(order, token)).content.decode()

    write(range(41, 80), UNBALANCED)  # again, the same day: said on the page, not e-mailed (once a day)
    assert _tick(start, 75, django_capture_on_commit_callbacks) == 1
    assert len(mail.outbox) == 1 and WatchAlert.objects.filter(order=order, ended_at__isnull=True).count() == 1


def test_a_balanced_window_is_never_said_and_a_gap_in_the_readings_says_nothing(
    running, django_capture_on_commit_callbacks
):
    order, _token, start, write = running
    mail.outbox.clear()
    write(range(0, 240), BALANCED)
    for minute in range(30, 240, 7):
        assert _tick(start, minute, django_capture_on_commit_callbacks) == 0
    # unbalanced, but 5 of the 30 minutes were not read (a host unreachable): nothing is said
    write(range(240, 270), UNBALANCED, skip={245, 250, 255, 260, 265})
    assert _tick(start, 269, django_capture_on_commit_callbacks) == 0
    assert not WatchAlert.objects.filter(order=order).exists() and mail.outbox == []


def test_idle_cards_for_hours_are_e_mailed_as_the_researcher_allows(running, django_capture_on_commit_callbacks):
    order, _token, start, write = running
    OperatorSettings.objects.filter(pk=1).update(idle_hours=2)
    mail.outbox.clear()
    write(range(0, 121), IDLE)
    assert _tick(start, 120, django_capture_on_commit_callbacks) == 1
    alert = WatchAlert.objects.get(order=order)
    assert alert.kind == "idle" and not WatchAlert.objects.filter(kind="imbalance").exists()
    assert len(mail.outbox) == 1 and "are idle" in mail.outbox[0].subject
    body = mail.outbox[0].body
    assert "at least 2 hours" in body and "df -h ~" in body and 'top -b -n 1 -u "$USER" | head -n 15' in body

    # once per window: a second stretch a day later is shown, not mailed
    order.alert_mails = AlertMails.ONCE
    order.save(update_fields=["alert_mails"])
    write(range(121, 122), BALANCED)
    _tick(start, 121, django_capture_on_commit_callbacks)
    write(range(24 * 60, 24 * 60 + 121), IDLE)
    assert _tick(start, 24 * 60 + 120, django_capture_on_commit_callbacks) == 1
    assert len(mail.outbox) == 1

    # at most once a day: a day after the last e-mail, it is mailed again
    order.alert_mails = AlertMails.DAILY
    order.save(update_fields=["alert_mails"])
    write(range(24 * 60 + 121, 24 * 60 + 122), BALANCED)
    _tick(start, 24 * 60 + 121, django_capture_on_commit_callbacks)
    write(range(24 * 60 + 130, 24 * 60 + 251), IDLE)
    assert _tick(start, 24 * 60 + 250, django_capture_on_commit_callbacks) == 1
    assert len(mail.outbox) == 2


def test_one_click_stops_the_e_mails_and_a_hostile_choice_changes_nothing(
    running, client, django_capture_on_commit_callbacks
):
    order, token, start, write = running
    page = client.get(order_url(order, token)).content.decode()
    assert "Stop these e-mails" in page and 'name="alert_mails" value="off"' in page
    url = reverse("customer:order-alert-mails", kwargs={"public_id": order.public_id, "token": token})

    for hostile in ("sometimes", "", "off" * 1000, "\x00"):
        answer = client.post(url, {"alert_mails": hostile}, follow=True)
        assert answer.status_code == 200 and "Choose how often these e-mails may come." in answer.content.decode()
    order.refresh_from_db()
    assert order.alert_mails == AlertMails.DAILY

    answer = client.post(url, {"alert_mails": ["daily", "off"]}, follow=True)  # a choice ticked, then the button
    assert "No more e-mails about your cards" in answer.content.decode()
    order.refresh_from_db()
    assert order.alert_mails == AlertMails.OFF
    assert "Stop these e-mails" not in answer.content.decode()

    mail.outbox.clear()
    write(range(31), UNBALANCED)
    assert _tick(start, 30, django_capture_on_commit_callbacks) == 1  # still said on the page
    assert mail.outbox == [] and WatchAlert.objects.get(order=order).mailed_at is None
    assert (
        client.post(
            reverse("customer:order-alert-mails", kwargs={"public_id": order.public_id, "token": "x" * 43}),
            {"alert_mails": "daily"},
        ).status_code
        == 404
    )


def test_an_alert_ends_with_the_window_and_speaks_the_order_s_language(running, django_capture_on_commit_callbacks):
    order, _token, start, write = running
    order.language = "fr"
    order.save(update_fields=["language"])
    mail.outbox.clear()
    write(range(31), UNBALANCED)
    _tick(start, 30, django_capture_on_commit_callbacks)
    assert "presque inactive" in mail.outbox[0].body and "presque inactive" in mail.outbox[0].subject
    order.status = OrderStatus.ENDED
    order.save(update_fields=["status"])
    _tick(start, 31, django_capture_on_commit_callbacks)
    assert WatchAlert.objects.get(order=order).ended_at is not None


def test_hostile_stored_readings_are_no_figures(running, django_capture_on_commit_callbacks):
    """What is stored came through the parsers; read as if it had not: garbage neither opens nor breaks anything."""
    _order, _token, start, write = running
    write(range(31), [[0, True, None, None, None, None], [1, "3", 1, 1, 1, 1], [99, 0, 0, 0, 0, 0], "x"])
    assert _tick(start, 30, django_capture_on_commit_callbacks) == 0
    write(range(31, 62), {"0": 97})
    assert _tick(start, 61, django_capture_on_commit_callbacks) == 0


def test_readings_from_the_host_s_tool_open_one_alert_through_the_minute_s_task(
    provisioned,  # noqa: F811
    stand_in_nvidia_smi,
    clock,
    django_capture_on_commit_callbacks,
):
    """The real path: the stand-in nvidia-smi on the test sshd reports GPU 0 busy and GPU 1 nearly idle; beat's
    minute task samples the host and watches the readings: after the operator's 30 minutes, one e-mail."""
    from provisioning.tasks import sample_readings

    order, _token, _username, _key = provisioned
    Access.objects.filter(order=order).update(status=Access.Status.READY)
    mail.outbox.clear()
    clock.now = clock.now.replace(second=5)
    for _minute in range(35):
        with django_capture_on_commit_callbacks(execute=True):
            assert sample_readings() == 1
        clock.now += timedelta(minutes=1)
    assert len(mail.outbox) == 1 and WatchAlert.objects.filter(order=order, kind="imbalance").count() == 1
    assert readings.readings_sample(now=clock.now) == 1


from tests.provisioning.customer_ssh import provisioned  # noqa: E402, F401 (fixture)
