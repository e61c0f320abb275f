"""A window that starts today, as soon as ready: at the first full hour its hosts can make, priced as any window,
its days counted from the hand-over; the turnaround and the exclusion constraint hold around it."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from booking import placing, selectors, services
from booking.models import Allocation, BookingPolicy, EnvironmentImage, Order, OrderEvent, OrderStatus
from booking.rules import BookingError, SoldOut
from booking.ssh_keys import parse_public_key
from booking.terms import terms_current
from inventory.models import Host, MaintenanceWindow
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning.lifecycle import lifecycle_tick
from provisioning.models import OperatorSettings
from tests.builders.console import act
from tests.builders.orders import place
from tests.factories import make_ssh_key

pytestmark = pytest.mark.django_db

TEN = datetime(2027, 3, 2, 10, 0, tzinfo=UTC)
TEN_S_DATE = TEN.date()


def request_for(
    catalog, *, slug="b200-pair", lots=1, days=7, when_ready=True, email="ada@example.org", start_date=TEN_S_DATE
):
    return placing.BookingRequest(
        hardware_class=catalog[slug],
        environment=EnvironmentImage.objects.get(
            slug="pytorch-2-6-rocm-6-4" if slug == "mi300x-pair" else "pytorch-2-7-cuda-12-8"
        ),
        lot_count=lots,
        start_date=start_date,
        days=days,
        contact=placing.Contact(name="Ada", email=email, organisation="Lab"),
        ssh_keys=[parse_public_key(make_ssh_key())],
        research=placing.Research(hypothesis="bigger_batch", detail="Batch 2048", measure="Examples per second"),
        terms_version_id=terms_current().pk,
        start_when_ready=when_ready,
    )


def book(request, *, now=TEN) -> Order:
    plan = placing.order_plan(request=request, now=now)
    with transaction.atomic():
        order, _token = placing.order_hold(plan=plan)
    return order


def test_booked_at_ten_it_starts_at_eleven_priced_as_any_window_its_lots_held_with_the_allowance(catalog):
    policy = BookingPolicy.current()
    order = book(request_for(catalog, lots=2))

    assert order.start_when_ready and order.clock_started_at is None
    assert order.starts_at == datetime(2027, 3, 2, 11, 0, tzinfo=UTC)  # the hosts' lead: 60 minutes
    assert order.ends_at == order.starts_at + timedelta(days=7)
    assert order.total_price == 2 * catalog["b200-pair"].prices.get(days=7).amount_per_lot
    held = set(order.allocations.values_list("starts_at", "ends_at"))
    assert held == {
        (
            order.starts_at - policy.turnaround,
            order.ends_at + policy.start_when_ready_allowance + policy.turnaround,
        )
    }


def test_a_slow_host_s_lots_wait_for_its_lead_and_a_quick_one_s_are_taken_first(catalog):
    b200 = catalog["b200-pair"]
    Host.objects.filter(name="b200-node-01").update(ready_within_minutes=30)
    Host.objects.filter(name__in=["b200-node-02", "b200-node-03"]).update(ready_within_minutes=150)

    first = book(request_for(catalog, lots=2))  # both lots of the quick host
    assert first.starts_at == datetime(2027, 3, 2, 11, 0, tzinfo=UTC)  # 10:30, to the next full hour
    assert set(first.allocations.values_list("lot__host__name", flat=True)) == {"b200-node-01"}

    second = book(request_for(catalog, lots=1, email="grace@example.org"))  # the quick host is full
    assert second.starts_at == datetime(2027, 3, 2, 13, 0, tzinfo=UTC)  # 12:30, to 13:00
    assert second.allocations.get().lot.host.name in {"b200-node-02", "b200-node-03"}
    assert (
        selectors.ready_start(hardware_class=b200, days=7, lot_count=5, policy=BookingPolicy.current(), now=TEN) is None
    )  # 4 lots left


def test_when_nothing_can_be_ready_today_it_is_sold_out_with_the_next_dates(catalog):
    book(request_for(catalog, slug="mi300x-pair"))  # the only MI300X lot
    with pytest.raises(SoldOut) as refused:
        book(request_for(catalog, slug="mi300x-pair", email="grace@example.org"))
    # the lot is free again after the window (7 days), its allowance and two turnarounds
    assert refused.value.next_dates and refused.value.next_dates[0] >= (TEN + timedelta(days=7)).date()


def test_the_operator_can_stop_offering_it(catalog):
    BookingPolicy.objects.filter(pk=1).update(offer_start_when_ready=False)
    with pytest.raises(BookingError) as refused:
        book(request_for(catalog))
    assert refused.value.field == "start_when_ready"
    assert not Order.objects.exists()


def test_the_clock_starts_at_the_hand_over_and_the_unused_allowance_is_given_back(catalog):
    policy = BookingPolicy.current()
    order = book(request_for(catalog))
    handed_over = datetime(2027, 3, 2, 11, 40, tzinfo=UTC)
    with transaction.atomic():
        assert services.order_start_clock(order=order, now=handed_over)
        assert not services.order_start_clock(order=order, now=handed_over + timedelta(hours=1))  # once only
    order.refresh_from_db()

    assert (order.starts_at, order.ends_at) == (handed_over, handed_over + timedelta(days=7))
    assert order.clock_started_at == handed_over
    assert order.allocations.get().ends_at == order.ends_at + policy.turnaround
    event = order.events.get(reason="window clock started at the hand-over")
    assert event.actor_kind == OrderEvent.Actor.SYSTEM
    assert event.evidence["planned_start"] == "2027-03-02T11:00:00+00:00"


def test_a_hand_over_later_than_the_allowance_gets_its_full_window_while_the_lots_stay_free(catalog):
    policy = BookingPolicy.current()
    order = book(request_for(catalog, slug="mi300x-pair"))
    late = order.starts_at + policy.start_when_ready_allowance + timedelta(hours=3)
    with transaction.atomic():
        services.order_start_clock(order=order, now=late)
    order.refresh_from_db()
    assert (order.starts_at, order.ends_at) == (late, late + timedelta(days=7))  # nobody booked the lot after it
    assert order.allocations.get().ends_at == order.ends_at + policy.turnaround


def _taken_right_after(order) -> MaintenanceWindow:
    """The order's cards are taken from the end of their hold: their host is in maintenance from then."""
    held_until = order.allocations.get().ends_at
    host = order.allocations.get().lot.host
    return MaintenanceWindow.objects.create(
        host=host, starts_at=held_until, ends_at=held_until + timedelta(days=2), reason="firmware"
    )


def test_a_hand_over_too_late_for_the_lots_ends_where_they_are_held_and_says_the_hours_lost(catalog):
    policy = BookingPolicy.current()
    order = book(request_for(catalog, slug="mi300x-pair"))
    maintenance = _taken_right_after(order)
    late = order.starts_at + policy.start_when_ready_allowance + timedelta(hours=3)
    with transaction.atomic():
        services.order_start_clock(order=order, now=late)
    order.refresh_from_db()
    assert order.starts_at == late
    assert order.ends_at + policy.turnaround == order.allocations.get().ends_at == maintenance.starts_at
    event = order.events.get(reason__startswith="window clock started at the hand-over; shortened")
    assert event.evidence["hours_lost"] == 3.0


def test_the_hold_booked_counts_not_an_allowance_raised_since(catalog):
    """An operator who raises the allowance after the booking does not lengthen the lots' hold: the window never
    runs into the next booking's cards."""
    policy = BookingPolicy.current()
    order = book(request_for(catalog, slug="mi300x-pair", days=3))
    maintenance = _taken_right_after(order)
    BookingPolicy.objects.filter(pk=1).update(start_when_ready_allowance_hours=48)
    with transaction.atomic():
        services.order_start_clock(order=order, now=order.starts_at + timedelta(hours=20))
    order.refresh_from_db()
    assert order.ends_at + policy.turnaround == order.allocations.get().ends_at == maintenance.starts_at
    mi300x = catalog["mi300x-pair"]
    running = selectors.Window(order.starts_at, order.ends_at, order.starts_at, order.ends_at)
    assert selectors.free_lot_ids(hardware_class=mi300x, window=running, limit=1) == []


def test_a_hand_over_after_the_lots_are_taken_is_refused_and_provisioning_marks_it_failed(catalog, admin_user):
    from provisioning.execution import _hand_over

    order = book(request_for(catalog, slug="mi300x-pair", days=3))
    too_late = _taken_right_after(order).starts_at
    with pytest.raises(BookingError), transaction.atomic():
        services.order_start_clock(order=order, now=too_late)
    order.refresh_from_db()
    assert order.clock_started_at is None
    for status in (OrderStatus.PAYMENT_PROCESSING, OrderStatus.PAID, OrderStatus.APPROVED, OrderStatus.PROVISIONING):
        services.order_transition(order=order, to_status=status, actor_kind=OrderEvent.Actor.SYSTEM)
    with transaction.atomic():
        _hand_over(order=order, now=too_late, reason="access ready", evidence={})
    order.refresh_from_db()
    assert order.status == OrderStatus.PROVISIONING_FAILED
    assert order.events.filter(reason="hand-over too late: the window's lots are taken").exists()


def test_an_early_hand_over_starts_the_window_when_the_lots_become_the_order_s(catalog):
    Host.objects.filter(name="mi300x-node-01").update(ready_within_minutes=24 * 60)
    order = book(request_for(catalog, slug="mi300x-pair"))
    held_from = order.allocations.get().starts_at
    with transaction.atomic():
        services.order_start_clock(order=order, now=TEN + timedelta(minutes=20))  # an operator provisioned at once
    order.refresh_from_db()
    assert order.starts_at == held_from > TEN + timedelta(minutes=20)
    assert order.ends_at == held_from + timedelta(days=7)


def test_waiting_for_its_hand_over_past_the_planned_hour_it_has_not_started_for_a_refund(catalog):
    from booking.cancellation import RefundRule, refund_quote

    order = book(request_for(catalog))
    quote = refund_quote(order=order, now=order.starts_at + timedelta(minutes=1))
    assert quote.rule == RefundRule.PARTIAL and quote.amount > 0


def test_its_keys_before_the_hand_over_last_as_long_as_its_lots_are_held(catalog):
    from provisioning.execution import _window_end

    policy = BookingPolicy.current()
    order = book(request_for(catalog))
    assert _window_end(order) == order.ends_at + policy.start_when_ready_allowance


def test_a_dated_window_s_clock_does_not_move(catalog):
    order = book(request_for(catalog, when_ready=False, start_date=TEN.date() + timedelta(days=2)))
    before = (order.starts_at, order.ends_at)
    with transaction.atomic():
        assert not services.order_start_clock(order=order, now=TEN + timedelta(hours=3))
    order.refresh_from_db()
    assert (order.starts_at, order.ends_at) == before


def test_the_turnaround_keeps_holding_after_the_hand_over_gave_the_allowance_back(catalog):
    """The lot is booked again from the first date its released period allows, not an hour sooner."""
    policy = BookingPolicy.current()
    order = book(request_for(catalog, slug="mi300x-pair", days=3))
    with transaction.atomic():
        services.order_start_clock(order=order, now=order.starts_at)
    order.refresh_from_db()
    free_from = order.ends_at + 2 * policy.turnaround  # its teardown, then the next window's preparation
    mi300x = catalog["mi300x-pair"]
    just_before = selectors.Window(
        starts_at=free_from - timedelta(minutes=1),
        ends_at=free_from + timedelta(days=3),
        held_from=free_from - timedelta(minutes=1) - policy.turnaround,
        held_until=free_from + timedelta(days=3) + policy.turnaround,
    )
    assert selectors.free_lot_ids(hardware_class=mi300x, window=just_before, limit=1) == []
    with pytest.raises(IntegrityError), transaction.atomic():  # the exclusion constraint, whatever a caller thinks
        Allocation.objects.create(
            order=order,
            lot=order.allocations.get().lot,
            starts_at=just_before.held_from,
            ends_at=just_before.held_until,
        )
    at = selectors.Window(
        starts_at=free_from,
        ends_at=free_from + timedelta(days=3),
        held_from=free_from - policy.turnaround,
        held_until=free_from + timedelta(days=3) + policy.turnaround,
    )
    assert len(selectors.free_lot_ids(hardware_class=mi300x, window=at, limit=1)) == 1


def test_a_late_payment_plans_the_start_again_from_now(catalog):
    order = book(request_for(catalog, slug="mi300x-pair"))
    order.allocations.update(released_at=TEN + timedelta(hours=1))  # the hold expired
    later = TEN + timedelta(hours=5, minutes=10)
    services.order_transition(order=order, to_status="expired", actor_kind=OrderEvent.Actor.SYSTEM)
    assert selectors.lots_free_again(order=order, now=later)  # what the payments app asks before holding it again
    services.order_reallocate_after_late_payment(order=order, evidence={"test": True}, now=later)
    order.refresh_from_db()
    assert order.status == "paid"
    assert order.starts_at == datetime(2027, 3, 2, 17, 0, tzinfo=UTC)  # 16:10, to 17:00
    assert order.allocations.in_use().count() == 1


def test_the_booking_form_books_it_and_the_order_page_says_when_it_counts(client, catalog, booking_data):
    response = client.post(reverse("customer:book"), booking_data(lots="1", start_when_ready="on", start_date=""))
    assert response.status_code == 302, response.content.decode()[:2000]
    order = Order.objects.get()
    assert order.start_when_ready
    page = client.get(response["Location"]).content.decode()
    assert "7 days from the hand-over: as soon as your machines are ready, planned for" in page
    assert order.starts_at.strftime("%Y-%m-%d %H:%M") in page


def test_the_booking_page_shows_the_earliest_start_today_and_links_the_calendar(client, catalog):
    page = client.get(reverse("customer:book")).content.decode()
    earliest = selectors.next_full_hour(datetime.now(UTC) + timedelta(minutes=60))
    assert "Earliest start of NVIDIA B200 pair: " in page
    assert earliest.strftime("%Y-%m-%d %H:%M") in page
    assert reverse("customer:calendar") in page


def test_paid_approved_and_provisioned_it_starts_counting_at_the_hand_over(
    client, catalog, booking_data, admin_user, operator, django_capture_on_commit_callbacks
):
    """The whole path, as the console drives it: the dry-run hosts hand over at once, and the window runs from
    then, active, for its full 7 days; the keys' expiry follows the end."""
    order, _token = place(client, booking_data(lots="1", start_when_ready="on", start_date=""))
    planned = order.starts_at
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    client.force_login(operator)
    before = datetime.now(UTC)
    for action in ("approve", "provision"):
        act(client, order, action, callbacks=django_capture_on_commit_callbacks)
    order.refresh_from_db()

    assert order.status == OrderStatus.ACTIVE
    assert before <= order.clock_started_at <= datetime.now(UTC) < planned
    assert order.starts_at == order.clock_started_at
    assert order.ends_at == order.starts_at + timedelta(days=7)
    assert order.events.filter(reason="window clock started at the hand-over").count() == 1
    grace = timedelta(minutes=OperatorSettings.current().key_grace_minutes)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle_tick()["keys_renewed"] == 1  # the window's end moved: its keys are rewritten
    access = order.accesses.get()
    assert access.keys_expire_at == order.ends_at + grace


def _failed_hand_over_with_access(catalog, monkeypatch):
    """An as-soon-as-ready order whose provisioning failed, an access left; the lifecycle's releases recorded."""
    from provisioning import lifecycle
    from provisioning.models import Access

    order = book(request_for(catalog, slug="mi300x-pair", days=3))
    for status in (OrderStatus.PAYMENT_PROCESSING, OrderStatus.PAID, OrderStatus.APPROVED, OrderStatus.PROVISIONING):
        services.order_transition(order=order, to_status=status, actor_kind=OrderEvent.Actor.SYSTEM)
    services.order_transition(order=order, to_status="provisioning_failed", actor_kind=OrderEvent.Actor.SYSTEM)
    Access.objects.create(order=order, host=order.allocations.get().lot.host, username="bn-waiting", gpu_indices="0,1")
    released = []
    monkeypatch.setattr(lifecycle, "access_release", lambda *, order_id, reason: released.append(order_id) or None)
    return order, released


def test_an_order_still_waiting_within_its_allowance_keeps_its_access_past_the_planned_end(catalog, monkeypatch):
    """The lifecycle releases the access of an order never handed over once its window passed; for one that starts
    as soon as ready, not before its lots' allowance runs out (it may still be handed over)."""
    from provisioning import lifecycle

    policy = BookingPolicy.current()
    order, released = _failed_hand_over_with_access(catalog, monkeypatch)

    lifecycle._tear_down_released(order.ends_at + timedelta(hours=1))  # past the planned end, within the allowance
    assert released == []
    lifecycle._tear_down_released(order.ends_at + policy.start_when_ready_allowance + timedelta(minutes=1))
    assert released == [order.pk]


def test_a_waiting_order_keeps_the_allowance_it_was_booked_with_when_the_policy_changes(catalog, monkeypatch):
    """The operator shortens the allowance after the booking: an order booked with the longer one may still be handed
    over until its lots' hold runs out, and keeps its access until then; lengthened, it gives nobody more."""
    from provisioning import lifecycle

    policy = BookingPolicy.current()
    booked_allowance = policy.start_when_ready_allowance
    order, released = _failed_hand_over_with_access(catalog, monkeypatch)

    policy.start_when_ready_allowance_hours = 1
    policy.save()
    lifecycle._tear_down_released(order.ends_at + booked_allowance - timedelta(minutes=1))
    assert released == []  # within the hold it was booked with, though past today's allowance

    policy.start_when_ready_allowance_hours = booked_allowance // timedelta(hours=1) + 10
    policy.save()
    lifecycle._tear_down_released(order.ends_at + booked_allowance + timedelta(minutes=1))
    assert released == [order.pk]  # its hold ran out: today's longer allowance was never booked
