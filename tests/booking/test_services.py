"""The order's state machine and the services around it."""

import pytest
from django.contrib.auth import get_user_model
from django.core import mail

from booking import links as order_links
from booking import services
from booking.models import ORDER_TRANSITIONS, Order, OrderEvent, OrderStatus
from booking.rules import InvalidTransition

pytestmark = pytest.mark.django_db


@pytest.fixture
def order(client, catalog, booking_data) -> Order:
    from django.urls import reverse

    client.post(reverse("customer:book"), booking_data(lots="2"))
    return Order.objects.get()


def test_the_happy_path_records_one_event_per_step_with_its_actor(order):
    operator = get_user_model().objects.create_user("olga", is_staff=True)
    steps = [
        (OrderStatus.PAYMENT_PROCESSING, OrderEvent.Actor.SYSTEM, None),
        (OrderStatus.PAID, OrderEvent.Actor.SYSTEM, None),
        (OrderStatus.APPROVED, OrderEvent.Actor.OPERATOR, operator),
        (OrderStatus.PROVISIONING, OrderEvent.Actor.SYSTEM, None),
        (OrderStatus.READY, OrderEvent.Actor.SYSTEM, None),
        (OrderStatus.ACTIVE, OrderEvent.Actor.SYSTEM, None),
        (OrderStatus.ENDED, OrderEvent.Actor.SYSTEM, None),
    ]
    for to_status, actor_kind, actor in steps:
        assert services.order_transition(order=order, to_status=to_status, actor_kind=actor_kind, actor=actor)

    trail = list(order.events.values_list("to_status", "actor_kind", "actor__username"))
    assert trail[0] == ("awaiting_payment", "customer", None)
    assert trail[3] == ("approved", "operator", "olga")
    assert [step[0] for step in trail[1:]] == [step[0] for step in steps]
    # Ending the window releases the lots.
    assert not order.allocations.filter(released_at__isnull=True).exists()


def test_a_transition_to_the_current_state_does_nothing(order):
    assert (
        services.order_transition(
            order=order, to_status=OrderStatus.AWAITING_PAYMENT, actor_kind=OrderEvent.Actor.SYSTEM
        )
        is False
    )
    assert order.events.count() == 1


@pytest.mark.parametrize(
    "to_status",
    sorted(set(OrderStatus.values) - set(ORDER_TRANSITIONS[OrderStatus.AWAITING_PAYMENT]) - {"awaiting_payment"}),
)
def test_transitions_outside_the_table_are_refused_and_change_nothing(order, to_status):
    with pytest.raises(InvalidTransition):
        services.order_transition(order=order, to_status=to_status, actor_kind=OrderEvent.Actor.SYSTEM)

    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert order.events.count() == 1
    assert order.allocations.filter(released_at__isnull=True).count() == 2


def test_a_customer_cannot_cancel_once_the_payment_is_being_confirmed(order):
    services.order_transition(order=order, to_status=OrderStatus.PAYMENT_PROCESSING, actor_kind=OrderEvent.Actor.SYSTEM)

    with pytest.raises(InvalidTransition):
        services.order_cancel_by_customer(order=order)
    assert order.allocations.filter(released_at__isnull=True).count() == 2


def test_final_states_have_no_way_out_but_a_late_payment_can_revive_an_expired_order():
    for final in (OrderStatus.CANCELLED, OrderStatus.ENDED, OrderStatus.REJECTED):
        assert ORDER_TRANSITIONS[final] == frozenset()
    assert ORDER_TRANSITIONS[OrderStatus.EXPIRED] == frozenset({OrderStatus.PAID})


def test_each_link_email_carries_a_new_working_token(order, client):
    order_links.order_send_link(order=order)
    order_links.order_send_link(order=order)

    links = [message.body.split("http://127.0.0.1:8000", 1)[1].split()[0] for message in mail.outbox]
    assert len(set(links)) == 2
    for link in links:
        assert client.get(link).status_code == 200


def test_the_expiry_task_argument_and_the_resend_task_argument_are_checked(order):
    from django.core.exceptions import ValidationError

    from booking.tasks import send_order_link, send_order_links

    send_order_link.delay(10**9)  # a vanished order is not an error
    with pytest.raises(ValidationError):
        send_order_links.delay("not an address", "fr")
    assert send_order_links.delay("ADA@example.org", "xx").get() == 1
    assert mail.outbox[-1].subject == "Your Binôme orders"  # an unknown language falls back to English
