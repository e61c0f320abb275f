"""Provisioning runs: creating them (one `ProvisioningStep` row per step and host) and every way one is started,
resumed or queued again: provisioning, retry, the hand-over, the pre-flight re-run, the keys, teardown, the wipe,
the release of hosts an order left, and the reassignment that leads to it. Executing a run is
provisioning/execution.py's job; the run's task is queued once the transaction that made or requeued it commits.
"""

from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from booking.locks import lock_order
from booking.models import Order, OrderStatus
from booking.services import order_credit_time, order_move_lot, order_note, order_reassign_lot, order_transition
from inventory.models import Host, Lot
from payments.refunds import refund_for_lost_time
from provisioning import steps
from provisioning.models import RETRIED_RUN_KINDS, Access, ProvisioningRun, ProvisioningStep
from provisioning.rules import (
    HANDING_OVER,
    UNDER_WAY,
    ProvisioningError,
    acting,
    awaits_preflight_decision,
    username_for,
)


def _hosts_of(order: Order) -> list[tuple[Host, list[int]]]:
    by_host: dict[int, tuple[Host, list[int]]] = {}
    for allocation in order.allocations.filter(released_at__isnull=True).select_related("lot__host"):
        host = allocation.lot.host
        by_host.setdefault(host.pk, (host, []))[1].extend(allocation.lot.gpu_index_list)
    return [(host, sorted(indices)) for host, indices in by_host.values()]


def held_host_ids(order: Order) -> set[int]:
    """The hosts of the order's live lots: those its access is on now (a host it left may still have an access
    until its teardown succeeds)."""
    return set(order.allocations.filter(released_at__isnull=True).values_list("lot__host_id", flat=True).distinct())


def _hosts_left(order: Order) -> list[Host]:
    """Hosts the order has an access on that is not revoked, but no live lot any more (a lot reassigned away)."""
    held = held_host_ids(order)
    accesses = order.accesses.exclude(status=Access.Status.REVOKED).exclude(host_id__in=held).select_related("host")
    return [access.host for access in accesses]


def _hosts_in_unfinished_runs(order: Order, *kinds: str) -> set[int]:
    """The hosts that a run of the order of one of `kinds` works on and has not finished (queued, running, or
    failed and waiting for its retry)."""
    steps_left = ProvisioningStep.objects.filter(run__order=order, run__kind__in=kinds).exclude(
        run__status=ProvisioningRun.Status.SUCCEEDED
    )
    return set(steps_left.values_list("host_id", flat=True))


def _hosts_for_run(order: Order, kind: str) -> list[tuple[Host, list[int]]]:
    """The hosts a run works on: those of the order's lots; for a teardown or a wipe, also every host the order
    ever had an access on (a lot reassigned away from a host leaves an account there). A teardown leaves out the
    hosts the order left that are released already, or being released by a run of their own (whose retries do
    not hold the order's end back). The release of hosts works on the hosts the order left."""
    if kind == ProvisioningRun.Kind.RELEASE_HOST:
        return [(host, []) for host in _hosts_left(order)]
    hosts = _hosts_of(order)
    if kind in (ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.WIPE) or not hosts:
        known = {host.pk for host, _indices in hosts}
        if kind == ProvisioningRun.Kind.TEARDOWN:
            known |= _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST)
        accesses = order.accesses.select_related("host")
        if kind == ProvisioningRun.Kind.TEARDOWN:
            accesses = accesses.exclude(status=Access.Status.REVOKED)
        hosts += [(access.host, []) for access in accesses if access.host_id not in known]
    return hosts


@transaction.atomic
def _create_run(
    *,
    order: Order,
    kind: str,
    step_names: list[str],
    actor: AbstractBaseUser | None,
    hosts: list[tuple[Host, list[int]]] | None = None,
) -> ProvisioningRun:
    run = ProvisioningRun.objects.create(order=order, kind=kind, triggered_by=actor)
    position = 0
    for host, gpu_indices in _hosts_for_run(order, kind) if hosts is None else hosts:
        access, created = Access.objects.get_or_create(
            order=order,
            host=host,
            defaults={"username": username_for(order), "gpu_indices": ",".join(map(str, gpu_indices))},
        )
        if not created and gpu_indices and access.gpu_indices != ",".join(map(str, gpu_indices)):
            access.gpu_indices = ",".join(map(str, gpu_indices))  # a lot reassigned on the same host
            access.save(update_fields=["gpu_indices"])
        if (
            kind in (ProvisioningRun.Kind.PROVISION, ProvisioningRun.Kind.MOVE)
            and access.status == Access.Status.REVOKED
        ):
            # A lot moved back to a host the order had left (and was torn down there): prepared afresh.
            _access_reopen(access)
        for name in step_names:
            ProvisioningStep.objects.create(run=run, host=host, position=position, name=name)
            position += 1
    from provisioning.tasks import execute_run

    transaction.on_commit(lambda: execute_run.delay(run.pk))
    return run


def _access_reopen(access: Access) -> None:
    access.status = Access.Status.PENDING
    access.revoked_at = access.ready_at = access.wiped_at = access.keys_expire_at = None
    access.preflight_report = None
    access.preflight_status = access.handover_note = ""
    access.save(
        update_fields=[
            "status",
            "revoked_at",
            "ready_at",
            "wiped_at",
            "keys_expire_at",
            "preflight_report",
            "preflight_status",
            "handover_note",
        ]
    )


@transaction.atomic
def provisioning_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    order_transition(order=order, to_status=OrderStatus.PROVISIONING, reason="provisioning started", **acting(actor))
    return _create_run(order=order, kind=ProvisioningRun.Kind.PROVISION, step_names=steps.PROVISION_STEPS, actor=actor)


def provisioning_retry(*, order: Order, actor: AbstractBaseUser, run_id: int | None = None) -> ProvisioningRun:
    """Resume a failed run where it stopped (steps done stay done): `run_id` (the console's "retry now" of a
    failing teardown, which would otherwise wait for its next retry), or else the order's last failed run among
    those that the sweep does not retry by itself (provisioning, pre-flight, keys)."""
    if run_id is None:
        runs = order.provisioning_runs.exclude(kind__in=RETRIED_RUN_KINDS)
    else:
        runs = order.provisioning_runs.filter(pk=run_id)
    run = runs.filter(status=ProvisioningRun.Status.FAILED).first()
    if run is not None and run.kind == ProvisioningRun.Kind.MOVE:
        moved_to = set(run.steps.values_list("host_id", flat=True))
        if not moved_to <= held_host_ids(order):  # a later move took the order elsewhere: this one must not run
            raise ProvisioningError(_("This move was replaced by a later one: there is nothing to retry."))
    if run is None:
        if run_id is not None and runs.filter(status__in=UNDER_WAY).exists():
            raise ProvisioningError(_("This run is being retried already."))
        raise ProvisioningError(_("There is no failed run to retry."))
    with transaction.atomic():
        if not _run_requeue(run_id=run.pk, clear_error=True):  # retried meanwhile (a second click, the sweep)
            raise ProvisioningError(_("This run is being retried already."))
        if run.kind in (ProvisioningRun.Kind.PROVISION, ProvisioningRun.Kind.KEYS) and order.status in HANDING_OVER:
            order_transition(order=order, to_status=OrderStatus.PROVISIONING, reason="retry", **acting(actor))
    return run


def _run_requeue(*, run_id: int, now: datetime | None = None, due: bool = False, clear_error: bool = False) -> bool:
    """Queue a failed run again (its task resumes it at the first step not done), if it is still failed (and, with
    `due`, its next retry is due by `now`): one conditional UPDATE, so two sweeps, or a sweep and an operator, never
    queue it twice. next_retry_at becomes the time it was queued: abandoned queued runs are resumed counting from
    it."""
    now = now or timezone.now()
    failed = ProvisioningRun.objects.filter(pk=run_id, status=ProvisioningRun.Status.FAILED)
    if due:
        failed = failed.filter(next_retry_at__lte=now)
    values = {"status": ProvisioningRun.Status.QUEUED, "lease_until": None, "next_retry_at": now}
    if clear_error:
        values["error"] = ""
    # A compare-and-set, so an UPDATE and not a save: the condition (still failed, still due) is what queues the
    # run once when two sweeps, or a sweep and an operator, reach it at the same time.
    if not failed.update(**values):
        return False
    from provisioning.tasks import execute_run

    transaction.on_commit(lambda: execute_run.delay(run_id))
    return True


def provisioning_hand_over(*, order: Order, actor: AbstractBaseUser, reason: str) -> ProvisioningRun:
    """Hand over machines whose pre-flight check failed; the customer reads `reason` beside the report. The keys
    are written by the hand-over run; the order turns ready when it succeeds."""
    reason = reason.strip()
    if not reason:
        raise ProvisioningError(
            _("Say why the machines are handed over despite the failed check: the customer reads it."), field="reason"
        )
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order.pk)
        if not awaits_preflight_decision(order):
            raise ProvisioningError(_("Only an order whose pre-flight check failed waits for this decision."))
        accesses_set(order, hosts=held_host_ids(order), handover_note=reason)
        return handover_start(order=order, actor=actor)


def handover_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    """The keys written and each container's sshd answering: only now can the customer log in, so that no process
    of theirs runs before the pre-flight check (or beside it). The order turns ready when this run succeeds."""
    return _create_run(order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor)


def preflight_rerun(*, order: Order, actor: AbstractBaseUser) -> ProvisioningRun:
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE) and not awaits_preflight_decision(order):
        raise ProvisioningError(_("The pre-flight check runs on machines that are ready."))
    return _create_run(order=order, kind=ProvisioningRun.Kind.PREFLIGHT, step_names=steps.PREFLIGHT_STEPS, actor=actor)


def access_keys_renew(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    """Rewrite the keys (the order's current ones, with the window's current end in their expiry-time: after a key
    change or an extension) wherever the customer can log in now: on the hosts of the order's lots, and on a host it
    left whose release has not started, where it still works (a move that has not succeeded yet, or failed). Not
    on a host being prepared (its hand-over writes them), nor one being released (its teardown revokes them)."""
    covered = _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.RELEASE_HOST)
    held = {host.pk: indices for host, indices in _hosts_of(order)}
    ready = order.accesses.filter(status=Access.Status.READY).exclude(host_id__in=covered).select_related("host")
    hosts = [(access.host, held.get(access.host_id, [])) for access in ready]
    return _create_run(
        order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor, hosts=hosts or None
    )


def download_keys_renew(*, order: Order) -> ProvisioningRun | None:
    """After the end, the keys changed: rewrite them in the download window of each host where it is open (until the
    wipe), so that a key removed then reads nothing more. None when no window is open."""
    windows = order.accesses.filter(
        download_port__isnull=False, wiped_at__isnull=True, download_until__gt=timezone.now()
    )
    hosts = [(access.host, []) for access in windows.select_related("host")]
    if not hosts:
        return None
    return _create_run(
        order=order,
        kind=ProvisioningRun.Kind.DOWNLOAD_KEYS,
        step_names=steps.DOWNLOAD_KEYS_STEPS,
        actor=None,
        hosts=hosts,
    )


def access_wipe_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    return _create_run(order=order, kind=ProvisioningRun.Kind.WIPE, step_names=steps.WIPE_STEPS, actor=actor)


@transaction.atomic
def teardown_start(
    *, order: Order, actor: AbstractBaseUser | None = None, reason: str = "window ended"
) -> ProvisioningRun:
    """Tear down every access of the order. One teardown run per order: a failed one is resumed (now), never
    started again; under the order's lock, so that two sweeps at once start one run."""
    order = lock_order(order.pk)
    teardowns = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN)
    if teardowns.exclude(status=ProvisioningRun.Status.FAILED).exists():
        raise ProvisioningError(_("The teardown of this order is already under way."))
    run = teardowns.first()
    if run is not None:
        _run_requeue(run_id=run.pk)
        reason = f"{reason} (the failed teardown resumed)"
    else:
        run = _create_run(order=order, kind=ProvisioningRun.Kind.TEARDOWN, step_names=steps.TEARDOWN_STEPS, actor=actor)
    order_note(order=order, reason=f"teardown: {reason}", evidence={"run": run.pk}, **acting(actor))
    return run


@transaction.atomic
def access_release_left_hosts(
    *, order: Order, actor: AbstractBaseUser | None = None, reason: str
) -> ProvisioningRun | None:
    """Tear down the hosts the order has an access on but no live lot any more, with a run on those hosts only
    (kind release_host, the teardown's steps). On success their accesses are revoked; the order goes on on its
    other hosts. A host that a teardown or release still under way (or failing, and retried) covers is left to
    it. None when no host was left."""
    order = lock_order(order.pk)
    covered = _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.RELEASE_HOST)
    left = [host for host in _hosts_left(order) if host.pk not in covered]
    if not left:
        return None
    run = _create_run(
        order=order,
        kind=ProvisioningRun.Kind.RELEASE_HOST,
        step_names=steps.TEARDOWN_STEPS,
        actor=actor,
        hosts=[(host, []) for host in left],
    )
    names = [host.name for host in left]
    order_note(
        order=order,
        reason=f"teardown of {', '.join(names)}: {reason}",
        evidence={"hosts": names, "run": run.pk},
        **acting(actor),
    )
    return run


@transaction.atomic
def lot_reassign(*, order: Order, from_lot_id: int, to_lot_id: int, actor: AbstractBaseUser) -> ProvisioningRun | None:
    """The console's reassignment: booking moves the lot, then every host the order left is torn down (its
    account, keys and container), in the same transaction. Returns the release run, if a host was left.

    A lot cannot move back to a host whose release is not finished: that teardown would undo the new
    provisioning there."""
    order = lock_order(order.pk)
    to_host_id = Lot.objects.filter(pk=to_lot_id).values_list("host_id", flat=True).first()
    if to_host_id in _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST):
        host = Host.objects.get(pk=to_host_id)
        raise ProvisioningError(
            _(
                "Access on %(host)s is still being torn down for this order: choose a lot on another host, or move "
                "it back once that teardown has succeeded."
            )
            % {"host": host.name},
            field="to_lot",
        )
    order_reassign_lot(order=order, from_lot_id=from_lot_id, to_lot_id=to_lot_id, actor=actor)
    return access_release_left_hosts(order=order, actor=actor, reason="lot reassigned")


class Credit:
    """How the time a provider fault cost is given back (the console's choice when it moves an order)."""

    NONE = "none"
    EXTENSION = "extension"  # the window ends later by the hours lost, if the lots are free for them
    REFUND = "refund"  # the hours lost refunded pro rata (payments.refunds.refund_for_lost_time), with a credit note
    ALL = (NONE, EXTENSION, REFUND)


@transaction.atomic
def order_move(
    *,
    order: Order,
    from_lot_id: int,
    to_lot_id: int,
    actor: AbstractBaseUser,
    hours_lost: int = 0,
    credit: str = Credit.NONE,
) -> ProvisioningRun:
    """A provider fault during a window: one of the order's lots moves to a free lot of its class for the rest of
    the window, the new lot is prepared, checked and handed over in one run (kind move), and only when it succeeds
    are the hosts the order left torn down (so the customer keeps working on the old one while it still works).
    On the same host the container is replaced and the data volume kept; on another host the customer starts from
    an empty volume, and is told so. The time lost is credited as a longer window or a pro-rata refund, in the
    same transaction: nothing moves if the credit cannot be given. The customer is e-mailed now and when the new
    machine is ready."""
    order = lock_order(order.pk)
    if credit not in Credit.ALL:
        raise ProvisioningError(_("Choose how the lost time is credited."), field="credit")
    window_hours = int((order.ends_at - order.starts_at).total_seconds() // 3600)
    if not isinstance(hours_lost, int) or not 0 <= hours_lost <= window_hours:
        raise ProvisioningError(
            _("The hours lost are a whole number from 0 to %(hours)d (the window's length).") % {"hours": window_hours},
            field="hours_lost",
        )
    if credit != Credit.NONE and hours_lost == 0:
        raise ProvisioningError(_("Say how many hours were lost, or credit nothing."), field="hours_lost")
    if order.provisioning_runs.filter(kind=ProvisioningRun.Kind.MOVE, status__in=UNDER_WAY).exists():
        raise ProvisioningError(_("A move of this order is under way: wait for it to finish (or fail) first."))
    lots = dict(Lot.objects.filter(pk__in=[from_lot_id, to_lot_id]).values_list("pk", "host_id"))
    to_host_id = lots.get(to_lot_id)
    if to_host_id in _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST, ProvisioningRun.Kind.TEARDOWN):
        raise ProvisioningError(
            _("Access on %(host)s is still being torn down for this order: choose a lot on another host.")
            % {"host": Host.objects.get(pk=to_host_id).name},
            field="to_lot",
        )
    data_kept = to_host_id in held_host_ids(order)  # before the move: the order already works on that host
    order_move_lot(order=order, from_lot_id=from_lot_id, to_lot_id=to_lot_id, actor=actor)
    if credit == Credit.EXTENSION:
        order_credit_time(order=order, lost=timedelta(hours=hours_lost), actor=actor)
    elif credit == Credit.REFUND:
        refund_for_lost_time(order=order, lost=timedelta(hours=hours_lost), lots=1)
    # The new lot's host first; then the old one's, if the order keeps another lot there: its container is made
    # again with the GPUs it keeps (start_container replaces a container whose lot changed, the volume stays).
    held = _hosts_of(order)
    moved = [(host, indices) for host, indices in held if host.pk == to_host_id]
    moved += [(host, indices) for host, indices in held if host.pk == lots.get(from_lot_id) != to_host_id]
    run = _create_run(
        order=order, kind=ProvisioningRun.Kind.MOVE, step_names=steps.MOVE_STEPS, actor=actor, hosts=moved
    )
    others = [(host, indices) for host, indices in held if host.pk not in {moved_host.pk for moved_host, _i in moved}]
    if credit == Credit.EXTENSION and others:  # the keys' expiry follows the window's new end there too
        _create_run(order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor, hosts=others)
    host = moved[0][0]
    order_note(
        order=order,
        reason=f"moving to {host.name} after a provider fault",
        evidence={"run": run.pk, "data_kept": data_kept, "credit": credit, "hours_lost": hours_lost},
        **acting(actor),
    )
    from provisioning.tasks import send_order_moved

    order_id, run_id = order.pk, run.pk
    transaction.on_commit(lambda: send_order_moved.delay(order_id, run_id, "started", data_kept, credit, hours_lost))
    return run


def accesses_set(order: Order, *, hosts=None, **values) -> None:
    """Write `values` on the order's accesses (on `hosts` only, when given). Revoking leaves an access revoked
    before as it was: the wipe's grace period counts from its first revocation."""
    accesses = order.accesses.all() if hosts is None else order.accesses.filter(host_id__in=hosts)
    if values.get("status") == Access.Status.REVOKED:
        accesses = accesses.exclude(status=Access.Status.REVOKED)
    for access in accesses:
        for name, value in values.items():
            setattr(access, name, value)
        access.save(update_fields=list(values))
