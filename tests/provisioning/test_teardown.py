"""Taking access away: a teardown that fails is retried with backoff (the same run, one note), shown once in the
console."""

import importlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from booking.models import Order, OrderStatus
from payments.selectors import current_invoice
from payments.services import invoice_mark_paid
from provisioning import services, steps
from provisioning.models import Access, Host, OperatorSettings, ProvisioningRun
from tests.booking.test_pages import place
from tests.provisioning.conftest import _free_port
from tests.provisioning.test_console import act

pytestmark = pytest.mark.django_db


@dataclass
class Clock:
    """The time every part of the portal reads (timezone.now), moved by the test like beat's ticks would."""

    now: datetime = field(default_factory=timezone.now)

    def advance(self, **delta) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(timezone, "now", lambda: clock.now)
    return clock


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("otto", password="a-long-operator-password", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    return user


@pytest.fixture
def unreachable(settings, keypair):
    """Make a host unreachable: the SSH driver, a pinned key, and a port nothing listens on (connection refused),
    as a host whose sshd died, or a docker host whose teardown always fails, looks to the portal."""
    private_key, public_key = keypair("portal-admin")
    settings.PROVISIONING_SSH_KEY_FILE = str(private_key)

    def break_host(host: Host) -> None:
        Host.objects.filter(pk=host.pk).update(
            driver=Host.Driver.SSH,
            address="127.0.0.1",
            ssh_port=_free_port(),
            host_key=" ".join(public_key.split()[:2]),
        )

    return break_host


def mend(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(driver=Host.Driver.DRY_RUN)


def paid(client, booking_data, admin_user, lots: str = "1") -> Order:
    order, _token = place(client, booking_data(lots=lots))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    order.refresh_from_db()
    return order


def provisioned(client, booking_data, admin_user, capture, lots: str = "1") -> Order:
    """An order handed over on the demo's dry-run hosts."""
    order = paid(client, booking_data, admin_user, lots)
    services.order_approve(order=order, actor=admin_user)
    with capture(execute=True):
        services.provisioning_start(order=order, actor=admin_user)
    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    return order


def tick(capture, now: datetime) -> dict:
    with capture(execute=True):  # eager Celery: the runs the tick queues are executed on commit
        return services.lifecycle_tick(now=now)


def the_host(order: Order) -> Host:
    (access,) = Access.objects.filter(order=order).select_related("host")
    return access.host


# --- a failing teardown ----------------------------------------------------------------------------------------


def test_the_retry_delay_doubles_from_one_minute_up_to_an_hour():
    delays = [services.retry_delay(attempts) for attempts in range(1, 10)]
    assert delays == [timedelta(minutes=minutes) for minutes in (1, 2, 4, 8, 16, 32, 60, 60, 60)]
    assert services.retry_delay(100_000) == timedelta(hours=1)  # a run failing hourly for years does not overflow


def test_a_failing_teardown_is_retried_with_growing_delays_as_one_run_with_one_note(
    client, booking_data, admin_user, clock, unreachable, django_capture_on_commit_callbacks
):
    # given an active window on a host whose teardown will fail
    order = provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    host = the_host(order)
    unreachable(host)

    # when beat ticks every 30 s from the window's end, for 16 minutes
    clock.now = order.ends_at + timedelta(seconds=1)
    start = clock.now
    tick(django_capture_on_commit_callbacks, clock.now)
    events_after_first_tick = order.events.count()
    run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    tried_at = [timedelta(0)]
    attempts = run.attempts
    while clock.now - start < timedelta(minutes=16):
        tick(django_capture_on_commit_callbacks, clock.advance(seconds=30))
        run.refresh_from_db()
        if run.attempts != attempts:
            tried_at.append(clock.now - start)
            attempts = run.attempts

    # then the same run was tried at 0, 1, 3, 7 and 15 minutes (1, 2, 4, 8 minutes apart), and nothing was added
    assert tried_at == [timedelta(minutes=minutes) for minutes in (0, 1, 3, 7, 15)]
    assert order.provisioning_runs.count() == 2  # the provisioning, and this one teardown
    assert run.status == ProvisioningRun.Status.FAILED and run.attempts == 5
    assert run.next_retry_at == run.finished_at + timedelta(minutes=16)
    assert "connection refused" in run.error
    assert order.events.count() == events_after_first_tick
    assert order.events.filter(reason__startswith="teardown:").count() == 1
    order.refresh_from_db()
    assert order.status == OrderStatus.ACTIVE  # not ended while its access is still there
    assert Access.objects.get(order=order).status == Access.Status.READY

    # and once the host is back, the next retry finishes the job where it stopped
    mend(host)
    clock.now = run.next_retry_at
    assert tick(django_capture_on_commit_callbacks, clock.now)["retried"] == 1
    run.refresh_from_db()
    order.refresh_from_db()
    assert run.status == ProvisioningRun.Status.SUCCEEDED and run.next_retry_at is None and run.error == ""
    assert [step.attempts for step in run.steps.all()] == [6] + [1] * (len(steps.TEARDOWN_STEPS) - 1)
    assert order.status == OrderStatus.ENDED
    assert Access.objects.get(order=order).status == Access.Status.REVOKED


def test_two_sweeps_at_once_queue_a_due_retry_once(
    client, booking_data, admin_user, clock, unreachable, django_capture_on_commit_callbacks
):
    order = provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    unreachable(the_host(order))
    with django_capture_on_commit_callbacks(execute=True):
        services.teardown_start(order=order, reason="test")
    run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    run.refresh_from_db()
    assert run.attempts == 1

    clock.now = run.next_retry_at
    with django_capture_on_commit_callbacks(execute=True) as queued:
        first = services.lifecycle_tick(now=clock.now)  # both before any worker took the run
        second = services.lifecycle_tick(now=clock.now)

    assert (first["retried"], second["retried"], second["resumed"]) == (1, 0, 0)
    assert sum(callback.__qualname__.startswith("_run_requeue") for callback in queued) == 1  # one execution
    run.refresh_from_db()
    assert run.attempts == 2 and order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN).count() == 1


def test_tearing_down_again_resumes_the_failed_teardown_instead_of_starting_one(
    client, booking_data, admin_user, operator, unreachable, django_capture_on_commit_callbacks
):
    order = provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    host = the_host(order)
    unreachable(host)
    client.force_login(operator)
    act(client, order, "teardown", {"reason": "customer asked"}, callbacks=django_capture_on_commit_callbacks)
    mend(host)

    act(client, order, "teardown", {"reason": "host fixed"}, callbacks=django_capture_on_commit_callbacks)

    (run,) = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN)
    assert run.status == ProvisioningRun.Status.SUCCEEDED and run.attempts == 2
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED


def test_a_failing_wipe_is_retried_not_started_again(
    client, booking_data, admin_user, clock, unreachable, django_capture_on_commit_callbacks
):
    order = provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    clock.now = order.ends_at + timedelta(seconds=1)
    tick(django_capture_on_commit_callbacks, clock.now)
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED
    unreachable(the_host(order))

    clock.now = order.ends_at + timedelta(days=OperatorSettings.current().wipe_after_days, minutes=1)
    for _tick in range(6):  # three minutes of ticks
        tick(django_capture_on_commit_callbacks, clock.advance(seconds=30))

    (wipe,) = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.WIPE)
    assert wipe.status == ProvisioningRun.Status.FAILED and wipe.attempts == 2  # at +30 s, then 1 min later
    assert Access.objects.get(order=order).wiped_at is None


def test_the_migration_schedules_the_latest_failed_teardown_left_by_the_old_sweep_only(
    client, booking_data, admin_user, clock, django_capture_on_commit_callbacks
):
    """Before 0009 the sweep started a new teardown every tick while the last one failed: those copies are
    history; only the latest failed run of each order and kind is retried from now on."""
    from django.apps import apps

    migration = importlib.import_module("provisioning.migrations.0009_run_retry_backoff")
    order = provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    failed = ProvisioningRun.Status.FAILED
    old_copies = [  # what the old sweep left, as rows (no service makes them any more)
        ProvisioningRun.objects.create(order=order, kind=ProvisioningRun.Kind.TEARDOWN, status=failed) for _ in range(3)
    ]
    wipe = ProvisioningRun.objects.create(order=order, kind=ProvisioningRun.Kind.WIPE, status=failed)
    preflight = ProvisioningRun.objects.create(order=order, kind=ProvisioningRun.Kind.PREFLIGHT, status=failed)

    migration.schedule_failed_teardowns(apps, None)

    scheduled = ProvisioningRun.objects.filter(attempts=1, next_retry_at=clock.now)
    assert set(scheduled.values_list("pk", flat=True)) == {old_copies[-1].pk, wipe.pk}
    assert not ProvisioningRun.objects.filter(pk=preflight.pk, next_retry_at__isnull=False).exists()


# --- the console ----------------------------------------------------------------------------------------------


def test_the_console_lists_a_failing_teardown_once_with_its_host_error_attempts_and_next_retry(
    client,
    booking_data,
    admin_user,
    operator,
    clock,
    unreachable,
    django_capture_on_commit_callbacks,
    django_assert_max_num_queries,
):
    order, other = (provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks) for _ in "ab")
    host = the_host(order)
    unreachable(host)
    unreachable(the_host(other))
    clock.now = order.ends_at + timedelta(seconds=1)
    for _tick in range(8):  # four minutes of ticks: three tries
        tick(django_capture_on_commit_callbacks, clock.advance(seconds=30))
    run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    client.force_login(operator)

    with django_assert_max_num_queries(9):  # as many with one failing run as with two
        queue = client.get(reverse("console:queue")).content.decode()

    section = queue.split('id="section-failing-teardowns"')[1].split("</section>")[0]
    assert section.count("<tr><td>") == 2  # one row per order, however many times the sweep tried
    for failing in (order, other):
        assert section.count(f'href="{reverse("console:order", kwargs={"public_id": failing.public_id})}"') == 1
    section = next(row for row in section.split("<tr><td>") if order.public_id in row)
    assert host.name in section and "connection refused" in section
    assert f"<td>{run.attempts}</td>" in section and run.attempts == 3
    assert run.next_retry_at.strftime("%Y-%m-%d %H:%M:%S") in section
    assert f'name="run" value="{run.pk}"' in section
    page = client.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()
    assert "Failed 3 times; retried by itself at" in page

    # the operator fixed the host and retries now, without waiting for the next retry
    mend(host)
    retry = {"run": str(run.pk)}
    done = act(client, order, "retry", retry, callbacks=django_capture_on_commit_callbacks).content.decode()

    assert f"{order.public_id}: retry done." in done
    run.refresh_from_db()
    assert run.status == ProvisioningRun.Status.SUCCEEDED
    queue = client.get(reverse("console:queue")).content.decode()
    section = queue.split('id="section-failing-teardowns"')[1].split("</section>")[0]
    assert order.public_id not in section and other.public_id in section
    again = act(client, order, "retry", retry, callbacks=django_capture_on_commit_callbacks).content.decode()
    assert "There is no failed run to retry." in again


def test_the_failing_teardowns_speak_french(
    client, booking_data, admin_user, operator, unreachable, django_capture_on_commit_callbacks
):
    order = provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    unreachable(the_host(order))
    with django_capture_on_commit_callbacks(execute=True):
        services.teardown_start(order=order, reason="test")
    client.force_login(operator)
    client.cookies["django_language"] = "fr"

    queue = client.get(reverse("console:queue")).content.decode()
    page = client.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()

    assert "Démontages en échec" in queue and "Prochain essai (UTC)" in queue and "Réessayer maintenant" in queue
    assert "Échouée une fois ; réessayée d’elle-même le" in page
    for english in ("Failing teardowns", "Retry now", "Next retry"):
        assert english not in queue + page, english
