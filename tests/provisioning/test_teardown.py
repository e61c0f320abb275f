"""Taking access away: a teardown that fails is retried with backoff (the same run, one note), shown once in the
console; a lot reassigned to another host tears the old host down and the order goes on."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from booking import selectors as booking_selectors
from booking.models import BookingPolicy, Order, OrderStatus
from booking.services import order_cancel_by_operator
from infrastructure import queues
from inventory.models import Host, Lot
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import lifecycle, moves, rules, runs, services, steps
from provisioning.models import Access, OperatorSettings, ProvisioningRun
from tests.builders.console import act, preflight_reporting
from tests.builders.orders import place
from tests.builders.teardown import make_provisioned, mend, paid, tick
from tests.provisioning.conftest import remove_user

pytestmark = pytest.mark.django_db


def the_host(order: Order) -> Host:
    (access,) = Access.objects.filter(order=order).select_related("host")
    return access.host


# --- a failing teardown ----------------------------------------------------------------------------------------


def test_the_retry_delay_doubles_from_one_minute_up_to_an_hour():
    delays = [rules.retry_delay(attempts) for attempts in range(1, 10)]
    assert delays == [timedelta(minutes=minutes) for minutes in (1, 2, 4, 8, 16, 32, 60, 60, 60)]
    assert rules.retry_delay(100_000) == timedelta(hours=1)  # a run failing hourly for years does not overflow


def test_a_failing_teardown_is_retried_with_growing_delays_as_one_run_with_one_note(
    client, booking_data, admin_user, clock, unreachable, django_capture_on_commit_callbacks
):
    # given an active window on a host whose teardown will fail
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
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
    assert order.provisioning_runs.exclude(kind="keys").count() == 2  # the provisioning, and this one teardown
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


def _queued(callbacks, task_name: str) -> list[tuple]:
    """The arguments of each on-commit callback that queues the task of that name (infrastructure.queues.after_commit
    registers a partial of its publisher with the task's name and arguments)."""
    return [
        callback.args[1]
        for callback in callbacks
        if getattr(callback, "func", None) is queues._publish and callback.args[0] == task_name
    ]


def test_two_sweeps_at_once_queue_a_due_retry_once(
    client, booking_data, admin_user, clock, unreachable, django_capture_on_commit_callbacks
):
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    unreachable(the_host(order))
    with django_capture_on_commit_callbacks(execute=True):
        runs.teardown_start(order=order, reason="test")
    run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    run.refresh_from_db()
    assert run.attempts == 1

    clock.now = run.next_retry_at
    with django_capture_on_commit_callbacks(execute=True) as queued:
        first = lifecycle.lifecycle_tick(now=clock.now)  # both before any worker took the run
        second = lifecycle.lifecycle_tick(now=clock.now)

    assert (first["retried"], second["retried"], second["resumed"]) == (1, 0, 0)
    assert _queued(queued, "provisioning.execute_run") == [(run.pk,)]  # one execution of the run
    run.refresh_from_db()
    assert run.attempts == 2 and order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN).count() == 1


def test_tearing_down_again_resumes_the_failed_teardown_instead_of_starting_one(
    client, booking_data, admin_user, operator, unreachable, django_capture_on_commit_callbacks
):
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
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
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
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
    order, other = (
        make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks) for _ in "ab"
    )
    host = the_host(order)
    unreachable(host)
    unreachable(the_host(other))
    clock.now = order.ends_at + timedelta(seconds=1)
    for _tick in range(8):  # four minutes of ticks: three tries
        tick(django_capture_on_commit_callbacks, clock.advance(seconds=30))
    run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    client.force_login(operator)

    # as many with one failing run as with two (one of them the footer's terms version, then kept in the cache)
    with django_assert_max_num_queries(12):  # + the money queues' whole counts (flagged payments, refunds)
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
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    unreachable(the_host(order))
    with django_capture_on_commit_callbacks(execute=True):
        runs.teardown_start(order=order, reason="test")
    client.force_login(operator)
    client.cookies["django_language"] = "fr"

    queue = client.get(reverse("console:queue")).content.decode()
    page = client.get(reverse("console:order", kwargs={"public_id": order.public_id})).content.decode()

    assert "Démontages et déplacements en échec" in queue and "Prochain essai (UTC)" in queue
    assert "Réessayer maintenant" in queue
    assert "Échouée une fois ; réessayée d’elle-même le" in page
    for english in ("Failing teardowns", "Retry now", "Next retry"):
        assert english not in queue + page, english


# --- reassignment ---------------------------------------------------------------------------------------------


@pytest.fixture
def failed_preflight(client, booking_data, admin_user, operator, monkeypatch, django_capture_on_commit_callbacks):
    """A one-lot order whose pre-flight failed on its (dry-run) host: it waits for an operator's decision."""
    order = paid(client, booking_data, admin_user)
    client.force_login(operator)
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("FAIL"))
    act(client, order, "approve", callbacks=django_capture_on_commit_callbacks)
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)
    order.refresh_from_db()
    assert rules.awaits_preflight_decision(order)
    return order


def lot_elsewhere(order: Order, *, same_host: bool = False) -> tuple[Lot, Lot]:
    """The order's lot, and a free lot of its class on another host (or on the same host)."""
    (allocation,) = order.allocations.filter(released_at__isnull=True).select_related("lot")
    held = allocation.lot
    others = Lot.objects.filter(hardware_class=order.hardware_class).exclude(pk=held.pk)
    others = others.filter(host=held.host) if same_host else others.exclude(host=held.host)
    return held, others.order_by("name").first()


def test_a_reassignment_to_another_host_tears_the_old_host_down_and_the_order_goes_on(
    client, failed_preflight, operator, monkeypatch, django_capture_on_commit_callbacks
):
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    old_host, new_host = held.host, elsewhere.host

    # when the operator moves the lot to another host
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)

    # then the old host is torn down by a run of its own, and the order keeps its status
    (release,) = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RELEASE_HOST)
    assert release.status == ProvisioningRun.Status.SUCCEEDED
    assert [(step.name, step.host_id) for step in release.steps.all()] == [
        (name, old_host.pk) for name in steps.TEARDOWN_STEPS
    ]
    old_access = Access.objects.get(order=order, host=old_host)
    assert old_access.status == Access.Status.REVOKED and old_access.revoked_at is not None
    order.refresh_from_db()
    assert order.status == OrderStatus.PROVISIONING_FAILED
    assert order.events.filter(reason=f"teardown of {old_host.name}: lot reassigned", actor=operator).exists()

    # and provisioning again works on the new host only; the old host's failed check no longer holds it back
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("PASS"))
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)
    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    provision = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.PROVISION).first()
    assert set(provision.steps.values_list("host_id", flat=True)) == {new_host.pk}
    assert Access.objects.get(order=order, host=new_host).status == Access.Status.READY
    old_access.refresh_from_db()
    assert old_access.status == Access.Status.REVOKED  # the hand-over did not bring it back

    # the final teardown works on the host the order is on; the old one keeps its revocation time
    revoked_at = old_access.revoked_at
    runs.teardown_start(order=order, reason="test")
    teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    assert set(teardown.steps.values_list("host_id", flat=True)) == {new_host.pk}
    old_access.refresh_from_db()
    assert old_access.revoked_at == revoked_at


def test_the_customer_sees_only_the_host_the_order_is_on(
    client, booking_data, admin_user, operator, monkeypatch, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data(lots="1"))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    client.force_login(operator)
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("FAIL"))
    act(client, order, "approve", callbacks=django_capture_on_commit_callbacks)
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)
    held, elsewhere = lot_elsewhere(order)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("PASS"))
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)

    page = client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": token}))

    text = page.content.decode()
    username = rules.username_for(order)
    assert f"{username}@{elsewhere.host.address}" in text
    assert f"{username}@{held.host.address}" not in text
    assert "bf16 matmul differs" not in text  # the old host's failed report is not shown either


def test_a_reassignment_on_the_same_host_tears_nothing_down(
    client, failed_preflight, monkeypatch, django_capture_on_commit_callbacks
):
    order = failed_preflight
    held, same_host = lot_elsewhere(order, same_host=True)

    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": same_host.pk}, django_capture_on_commit_callbacks)

    assert order.allocations.in_use().get().lot == same_host
    assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RELEASE_HOST).exists()
    assert Access.objects.get(order=order).status != Access.Status.REVOKED
    # the container there still holds the old lot's cards: held for no one until provisioning makes it again
    assert held.pk not in _free_lots(order)
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("PASS"))
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)
    assert held.pk in _free_lots(order)


def _free_lots(order: Order) -> list[int]:
    """The lots of the order's class a booking of the same window could take."""
    window = booking_selectors.window_for(
        start_date=order.starts_at.date(), days=order.days, policy=BookingPolicy.current()
    )
    return booking_selectors.free_lot_ids(hardware_class=order.hardware_class, window=window, limit=100)


def test_a_reassigned_lot_stays_held_until_the_release_removed_the_container_on_its_cards(
    client, failed_preflight, clock, unreachable, django_capture_on_commit_callbacks
):
    """The console's reassignment released the old lot at once, while the release run had not removed the old
    container yet (a host down, a teardown failing): a new order booked the lot and its container started on cards
    the first order's container still held. The old lot is vacated, as a move's, until the release succeeds."""
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    unreachable(held.host)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)
    release = order.provisioning_runs.get(kind=ProvisioningRun.Kind.RELEASE_HOST)
    assert release.status == ProvisioningRun.Status.FAILED
    assert held.pk not in _free_lots(order) and elsewhere.pk not in _free_lots(order)

    mend(held.host)
    clock.now = release.next_retry_at
    tick(django_capture_on_commit_callbacks, clock.now)
    release.refresh_from_db()
    assert release.status == ProvisioningRun.Status.SUCCEEDED
    assert held.pk in _free_lots(order)  # the container on its cards is gone: on sale again


def test_a_failing_release_is_retried_and_blocks_neither_the_new_host_nor_a_move_back_once_done(
    client, failed_preflight, monkeypatch, clock, unreachable, django_capture_on_commit_callbacks
):
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    old_host = held.host
    unreachable(old_host)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)
    release = order.provisioning_runs.get(kind=ProvisioningRun.Kind.RELEASE_HOST)
    assert release.status == ProvisioningRun.Status.FAILED and release.next_retry_at is not None

    # the new host is provisioned and handed over while the old one's release waits for its retry
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("PASS"))
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)
    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    assert Access.objects.get(order=order, host=old_host).status != Access.Status.READY
    queue = client.get(reverse("console:queue")).content.decode()
    assert old_host.name in queue.split('id="section-failing-teardowns"')[1].split("</section>")[0]

    # the release's retry succeeds once the host is back
    mend(old_host)
    clock.now = release.next_retry_at
    tick(django_capture_on_commit_callbacks, clock.now)
    release.refresh_from_db()
    assert release.status == ProvisioningRun.Status.SUCCEEDED and release.attempts == 2
    assert Access.objects.get(order=order, host=old_host).status == Access.Status.REVOKED
    order.refresh_from_db()
    assert order.status in (OrderStatus.READY, OrderStatus.ACTIVE)


def test_a_lot_cannot_move_back_to_a_host_whose_release_is_not_done(
    client, failed_preflight, unreachable, django_capture_on_commit_callbacks
):
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    unreachable(held.host)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)

    refused = act(client, order, "reassign", {"from_lot": elsewhere.pk, "to_lot": held.pk})

    assert f"Access on {held.host.name} is still being torn down for this order" in refused.content.decode()
    assert order.allocations.in_use().get().lot == elsewhere


def test_moving_a_lot_back_after_its_release_prepares_that_host_afresh(
    client, failed_preflight, monkeypatch, django_capture_on_commit_callbacks
):
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)
    act(client, order, "reassign", {"from_lot": elsewhere.pk, "to_lot": held.pk}, django_capture_on_commit_callbacks)
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RELEASE_HOST).count() == 1  # never provisioned

    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("PASS"))
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)

    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    access = Access.objects.get(order=order, host=held.host)
    assert access.status == Access.Status.READY and access.revoked_at is None and access.preflight_status == "PASS"


def test_cancelling_after_a_reassignment_tears_down_the_host_left_too(
    client, failed_preflight, operator, clock, django_capture_on_commit_callbacks
):
    """The reassignment's release has not run yet (its task was lost) when the order is cancelled: the
    cancellation's teardown leaves that host to it, and the sweep resumes it."""
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk})  # its run's task never runs
    release = order.provisioning_runs.get(kind=ProvisioningRun.Kind.RELEASE_HOST)
    assert release.status == ProvisioningRun.Status.QUEUED

    with django_capture_on_commit_callbacks(execute=True):
        order_cancel_by_operator(order=order, actor=operator, reason="researcher asked")
    teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    assert teardown.status == ProvisioningRun.Status.SUCCEEDED
    assert held.host_id not in set(teardown.steps.values_list("host_id", flat=True))
    tick(django_capture_on_commit_callbacks, clock.advance(minutes=6))  # the sweep resumes queued runs

    release.refresh_from_db()
    assert release.status == ProvisioningRun.Status.SUCCEEDED
    assert set(order.accesses.values_list("status", flat=True)) == {Access.Status.REVOKED}
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED


def test_a_window_ends_on_time_while_the_host_it_left_still_fails_its_release(
    client, failed_preflight, monkeypatch, clock, unreachable, django_capture_on_commit_callbacks
):
    order = failed_preflight
    held, elsewhere = lot_elsewhere(order)
    unreachable(held.host)
    act(client, order, "reassign", {"from_lot": held.pk, "to_lot": elsewhere.pk}, django_capture_on_commit_callbacks)
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("PASS"))
    act(client, order, "provision", callbacks=django_capture_on_commit_callbacks)
    order.refresh_from_db()

    clock.now = order.ends_at + timedelta(seconds=1)
    tick(django_capture_on_commit_callbacks, clock.now)

    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED
    assert Access.objects.get(order=order, host=elsewhere.host).status == Access.Status.REVOKED
    assert Access.objects.get(order=order, host=held.host).status != Access.Status.REVOKED  # not torn down yet
    release = order.provisioning_runs.get(kind=ProvisioningRun.Kind.RELEASE_HOST)
    assert release.status == ProvisioningRun.Status.FAILED  # retried on its own, with backoff


# --- on a real host -------------------------------------------------------------------------------------------


def test_a_reassignment_leaves_nothing_of_the_customer_running_on_the_old_host(
    client, loopback_host, booking_data, keypair, admin_user, admin, login_as, django_capture_on_commit_callbacks
):
    """On the test sshd: the pre-flight fails (no GPU here), the operator moves the lot to another host; the
    customer's account on the old host is locked, their processes are gone and their key no longer logs in."""
    private_key, public_key = keypair("customer")
    order, _token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    username = rules.username_for(order)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_start(order=order, actor=admin_user)
        order.refresh_from_db()
        assert rules.awaits_preflight_decision(order)
        # a process the customer left behind on the host (a server, a job started before the hand-over)
        admin.run(["sh", "-c", 'runuser -u "$1" -- setsid sleep 600 >/dev/null 2>&1 &', "left", username])
        assert admin.run(["pgrep", "-u", username], check=False).exit_status == 0
        held = order.allocations.get(released_at__isnull=True).lot
        elsewhere = Lot.objects.filter(hardware_class=held.hardware_class).exclude(host=loopback_host).first()
        Lot.objects.filter(pk=elsewhere.pk).update(status=Lot.Status.ACTIVE)  # the fixture kept the others off

        with django_capture_on_commit_callbacks(execute=True):
            moves.lot_reassign(order=order, from_lot_id=held.pk, to_lot_id=elsewhere.pk, actor=admin_user)

        release = order.provisioning_runs.get(kind=ProvisioningRun.Kind.RELEASE_HOST)
        assert release.status == ProvisioningRun.Status.SUCCEEDED, release.error
        assert admin.run(["pgrep", "-u", username], check=False).exit_status == 1  # nothing of theirs runs
        assert login_as(username, private_key, "true").returncode != 0
        assert Access.objects.get(order=order, host=loopback_host).status == Access.Status.REVOKED
        order.refresh_from_db()
        assert order.status == OrderStatus.PROVISIONING_FAILED
    finally:
        remove_user(admin, username)


def test_a_window_that_passed_before_its_hand_over_leaves_no_container_and_the_order_to_the_operator(
    client, booking_data, admin_user, monkeypatch, django_capture_on_commit_callbacks
):
    # given an order whose pre-flight failed and that no operator decided on before its window ended
    monkeypatch.setitem(steps.STEPS, "preflight", preflight_reporting("FAIL"))
    order = paid(client, booking_data, admin_user)
    services.order_approve(order=order, actor=admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        runs.provisioning_start(order=order, actor=admin_user)
    order.refresh_from_db()
    assert order.status == OrderStatus.PROVISIONING_FAILED
    assert tick(django_capture_on_commit_callbacks, order.ends_at - timedelta(minutes=1))["torn_down"] == 0

    # when the window has passed, the beat tears its machines down once, and the order stays for the operator
    assert tick(django_capture_on_commit_callbacks, order.ends_at + timedelta(minutes=1))["torn_down"] == 1
    assert tick(django_capture_on_commit_callbacks, order.ends_at + timedelta(minutes=2))["torn_down"] == 0
    teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    assert teardown.status == ProvisioningRun.Status.SUCCEEDED
    assert set(order.accesses.values_list("status", flat=True)) == {Access.Status.REVOKED}
    order.refresh_from_db()
    assert order.status == OrderStatus.PROVISIONING_FAILED


def test_a_failing_keys_renewal_is_not_started_again_every_tick(
    client, booking_data, admin_user, unreachable, django_capture_on_commit_callbacks
):
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    unreachable(the_host(order))
    Order.objects.filter(pk=order.pk).update(ends_at=order.ends_at + timedelta(days=7))  # an extension was paid
    now = timezone.now()
    assert tick(django_capture_on_commit_callbacks, now)["keys_renewed"] == 1
    assert tick(django_capture_on_commit_callbacks, now + timedelta(minutes=1))["keys_renewed"] == 0
    keys_runs = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS)
    assert keys_runs.filter(status=ProvisioningRun.Status.FAILED).count() == 1
    assert keys_runs.count() == 2  # the hand-over's, and the one renewal that failed
