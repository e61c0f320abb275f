"""Provisioning's rules, shared by its service modules (runs, execution, lifecycle, hosts, services) and importing
none of them: the error they raise, the customer's account name on a host, who an event names, the order states
that decide what a run does, and how long a failed run waits before it is tried again.
"""

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser

from booking.models import Order, OrderEvent, OrderStatus
from booking.rules import BookingError
from provisioning.models import ProvisioningRun


class ProvisioningError(BookingError):
    pass


def username_for(order: Order) -> str:
    return "bn-" + order.public_id.removeprefix("BN-").lower()


def acting(actor: AbstractBaseUser | None) -> dict:
    """Who an order event names: the operator who acted, or the system when no one did."""
    return {"actor_kind": OrderEvent.Actor.OPERATOR if actor else OrderEvent.Actor.SYSTEM, "actor": actor}


UNDER_WAY = (ProvisioningRun.Status.QUEUED, ProvisioningRun.Status.RUNNING)
# Where a keys run is the hand-over (in a ready or active window it only moves the keys' expiry).
HANDING_OVER = (OrderStatus.PROVISIONING, OrderStatus.PROVISIONING_FAILED)


# A failed run of RETRIED_RUN_KINDS (teardown, wipe, release of a host) is queued again by the lifecycle sweep
# after retry_delay(attempts); the same run resumes at its failed step.
RETRY_FIRST_DELAY = timedelta(minutes=1)
RETRY_MAX_DELAY = timedelta(hours=1)


def retry_delay(attempts: int) -> timedelta:
    """How long a run that failed `attempts` times waits before its next try: 1 min, 2, 4, ... at most 1 h."""
    return min(RETRY_FIRST_DELAY * 2 ** min(max(attempts, 1) - 1, 16), RETRY_MAX_DELAY)


def awaits_preflight_decision(order: Order) -> bool:
    """The machines were prepared but their pre-flight check failed: an operator re-runs it, reassigns the lots
    or hands the machines over anyway. (A failed hand-over run waits for a retry instead.)"""
    if order.status != OrderStatus.PROVISIONING_FAILED:
        return False
    last = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.PROVISION).first()
    latest = order.provisioning_runs.first()
    return (
        last is not None
        and last.status == ProvisioningRun.Status.SUCCEEDED
        and not (latest and latest.status == ProvisioningRun.Status.FAILED)
    )
