"""Provisioning runs: creating them (one `ProvisioningStep` row per step and host) and every way one is started,
resumed or queued again: a starter for each kind of run (`ProvisioningRun.Kind` is the list), the retry of a failed
one, and the release of the hosts an order left (the operators' reassignment and provider-fault move that lead to
it: provisioning/moves.py). Executing a run is provisioning/execution.py's job; the run's task is queued once the
transaction that made or requeued it commits.
"""

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from booking.locks import lock_order
from booking.models import Order, OrderStatus
from booking.services import order_note, order_transition
from inventory.models import Host
from provisioning import enqueue, steps
from provisioning.models import RETRIED_RUN_KINDS, Access, ProvisioningRun, ProvisioningStep
from provisioning.rules import (
    HANDING_OVER,
    UNDER_WAY,
    ProvisioningError,
    acting,
    awaits_preflight_decision,
    username_for,
)


def hosts_of(order: Order) -> list[tuple[Host, list[int]]]:
    by_host: dict[int, tuple[Host, list[int]]] = {}
    for allocation in order.allocations.in_use().select_related("lot__host"):
        host = allocation.lot.host
        by_host.setdefault(host.pk, (host, []))[1].extend(allocation.lot.gpu_index_list)
    return [(host, sorted(indices)) for host, indices in by_host.values()]


def held_host_ids(order: Order) -> set[int]:
    """The hosts of the order's live lots: those its access is on now (a host it left may still have an access
    until its teardown succeeds)."""
    return set(order.allocations.in_use().values_list("lot__host_id", flat=True).distinct())


def _hosts_left(order: Order) -> list[Host]:
    """Hosts the order has an access on that is not revoked, but no live lot any more (a lot reassigned away)."""
    held = held_host_ids(order)
    accesses = order.accesses.exclude(status=Access.Status.REVOKED).exclude(host_id__in=held).select_related("host")
    return [access.host for access in accesses]


def hosts_in_unfinished_runs(order: Order, *kinds: str) -> set[int]:
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
    hosts = hosts_of(order)
    if kind in (ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.WIPE) or not hosts:
        known = {host.pk for host, _indices in hosts}
        if kind == ProvisioningRun.Kind.TEARDOWN:
            known |= hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST)
        accesses = order.accesses.select_related("host")
        if kind == ProvisioningRun.Kind.TEARDOWN:
            accesses = accesses.exclude(status=Access.Status.REVOKED)
        hosts += [(access.host, []) for access in accesses if access.host_id not in known]
    return hosts


@transaction.atomic
def run_create(
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
    enqueue.execute_run(run.pk)
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
    return run_create(order=order, kind=ProvisioningRun.Kind.PROVISION, step_names=steps.PROVISION_STEPS, actor=actor)


def provisioning_retry(*, order: Order, actor: AbstractBaseUser, run_id: int | None = None) -> ProvisioningRun:
    """Resume a failed run where it stopped (steps done stay done): `run_id` (the console's "retry now" of a
    failing teardown, which would otherwise wait for its next retry), or else the order's last failed run among
    those that the sweep does not retry by itself (provisioning, pre-flight, keys)."""
    if run_id is None:
        runs = order.provisioning_runs.exclude(kind__in=RETRIED_RUN_KINDS)
    else:
        runs = order.provisioning_runs.filter(pk=run_id)
    run = runs.filter(status=ProvisioningRun.Status.FAILED).first()
    if run is not None and run.given_up_at is not None:
        raise ProvisioningError(_("This run was given up: there is nothing to retry."))
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
    enqueue.execute_run(run_id)
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
    return run_create(order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor)


def preflight_rerun(*, order: Order, actor: AbstractBaseUser) -> ProvisioningRun:
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE) and not awaits_preflight_decision(order):
        raise ProvisioningError(_("The pre-flight check runs on machines that are ready."))
    return run_create(order=order, kind=ProvisioningRun.Kind.PREFLIGHT, step_names=steps.PREFLIGHT_STEPS, actor=actor)


def access_keys_renew(
    *, order: Order, actor: AbstractBaseUser | None = None, end_sessions: bool = False
) -> ProvisioningRun:
    """Rewrite the keys (the order's current ones, with the window's current end in their expiry-time: after a key
    change or an extension) wherever the customer can log in now: on the hosts of the order's lots, and on a host it
    left whose release has not started, where it still works (a move that has not succeeded yet, or failed). Not
    on a host being prepared (its hand-over writes them), nor one being released (its teardown revokes them).
    `end_sessions` (a key was removed): then every open session there is ended (container_steps.end_sessions)."""
    covered = hosts_in_unfinished_runs(order, ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.RELEASE_HOST)
    held = {host.pk: indices for host, indices in hosts_of(order)}
    ready = order.accesses.filter(status=Access.Status.READY).exclude(host_id__in=covered).select_related("host")
    hosts = [(access.host, held.get(access.host_id, [])) for access in ready]
    step_names = steps.KEYS_REMOVED_STEPS if end_sessions else steps.KEYS_STEPS
    return run_create(
        order=order, kind=ProvisioningRun.Kind.KEYS, step_names=step_names, actor=actor, hosts=hosts or None
    )


def container_restart_start(*, order: Order, hosts: list[Host], actor: AbstractBaseUser | None) -> ProvisioningRun:
    """Start the order's stopped container again on `hosts` (the watch's decision: provisioning/restarts.py)."""
    return run_create(
        order=order,
        kind=ProvisioningRun.Kind.RESTART,
        step_names=steps.RESTART_STEPS,
        actor=actor,
        hosts=[(host, []) for host in hosts],
    )


@transaction.atomic
def container_restart(*, order: Order, actor: AbstractBaseUser) -> ProvisioningRun:
    """The operator's decision on a container the watch left stopped after it kept stopping: started again, its
    count of restarts back to zero (the watch restarts it again if it stops, with its backoff and ceiling)."""
    order = lock_order(order.pk)
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        raise ProvisioningError(_("Only a running window's container can be started again."))
    if order.provisioning_runs.filter(status__in=UNDER_WAY).exists():
        raise ProvisioningError(_("A run of this order is under way: wait for it to end."))
    ready = order.accesses.filter(status=Access.Status.READY).select_related("host")
    held = [access for access in ready if access.restarts_held_at] or list(ready)
    if not held:
        raise ProvisioningError(_("This order has no container to start."))
    Access.objects.filter(pk__in=[access.pk for access in held]).update(
        restarts=0, restarted_at=None, restarts_held_at=None
    )
    names = ", ".join(access.host.name for access in held)
    run = container_restart_start(order=order, hosts=[access.host for access in held], actor=actor)
    order_note(order=order, reason=f"container started again on {names}", evidence={"run": run.pk}, **acting(actor))
    return run


def download_keys_renew(*, order: Order, end_sessions: bool = False) -> ProvisioningRun | None:
    """After the end, the keys changed: rewrite them in the download window of each host where it is open (until the
    wipe), so that a key removed then reads nothing more, and with `end_sessions` (a key was removed) end the SFTP
    sessions open there. None when no window is open."""
    windows = order.accesses.filter(
        download_port__isnull=False, wiped_at__isnull=True, download_until__gt=timezone.now()
    )
    hosts = [(access.host, []) for access in windows.select_related("host")]
    if not hosts:
        return None
    return run_create(
        order=order,
        kind=ProvisioningRun.Kind.DOWNLOAD_KEYS,
        step_names=steps.DOWNLOAD_KEYS_REMOVED_STEPS if end_sessions else steps.DOWNLOAD_KEYS_STEPS,
        actor=None,
        hosts=hosts,
    )


def access_wipe_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    return run_create(order=order, kind=ProvisioningRun.Kind.WIPE, step_names=steps.WIPE_STEPS, actor=actor)


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
        run = run_create(order=order, kind=ProvisioningRun.Kind.TEARDOWN, step_names=steps.TEARDOWN_STEPS, actor=actor)
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
    covered = hosts_in_unfinished_runs(order, ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.RELEASE_HOST)
    left = [host for host in _hosts_left(order) if host.pk not in covered]
    if not left:
        return None
    run = run_create(
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
