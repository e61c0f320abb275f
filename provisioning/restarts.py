"""The watch over the customers' containers during their windows: a container found stopped is started again, with
a backoff that doubles at each restart and a ceiling, past which it is left stopped and the operators are told.

Why the portal and not the runtime: the customer is root in their container and can stop it (kill its main process,
raise its OOM score and fill its memory). podman's `--restart always` started it again at once and forever, each
start doing root's work on the host (mounts, interfaces, firewall rules) outside the tenant's CPU share, with no
backoff and no one told. The containers now run with `--restart no`; beat asks each host with running windows, once
a minute, which containers stopped (one `ps`), and this module decides, under the order's lock: the first restart
at once, then at least RESTART_BACKOFF × 2^(n-1) after the n-th; after RESTART_LIMIT restarts within RESTART_QUIET
of each other, the container is held (left stopped, an event on the order, an e-mail to the operators) until an
operator starts it again from the console (runs.container_restart). A host that rebooted gets its containers back
within a minute, the firewall guard rebuilt first (start_ssh). Each restart is a run of kind `restart`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from booking import notices
from booking.locks import lock_order
from booking.models import OrderEvent, OrderStatus
from booking.services import order_note
from inventory.models import Host
from provisioning import containers
from provisioning.drivers.base import Connection, DriverError
from provisioning.hosts import host_connect
from provisioning.models import Access
from provisioning.rules import UNDER_WAY
from provisioning.runs import container_restart_start

logger = logging.getLogger(__name__)

RESTART_BACKOFF = timedelta(seconds=60)
RESTART_LIMIT = 5
RESTART_QUIET = timedelta(hours=6)  # a container that ran this long since its last restart starts a new count
HOSTS_PER_SWEEP = 50
MAX_CONTAINERS = 1000
# What a container the watch restarts is in: stopped by itself, or made and never started. A paused one is being
# removed (remove_container freezes it first); a running one needs nothing.
STOPPED = ("exited", "stopped", "created", "configured")


def restart_delay(restarts: int) -> timedelta:
    """How long after its n-th restart a container that stopped again waits for the next one."""
    return RESTART_BACKOFF * 2 ** max(0, restarts - 1)


def container_states(connection: Connection, runtime: containers.Runtime) -> dict[str, str]:
    """The state of each of the portal's containers on the host, by name (the runtime's answer, parsed and bounded)."""
    argv = runtime.command(
        "ps", "--all", "--filter", f"label={containers.SPEC_LABEL}", "--format", "{{.Names}} {{.State}}"
    )
    answer = connection.run(argv, check=False, timeout=60)
    states = {}
    for line in answer.stdout.splitlines()[:MAX_CONTAINERS]:
        name, _, state = line.strip().partition(" ")
        word = state.split(" ", 1)[0].lower()  # podman 4.3: "Up 3 minutes ago", "Exited (143) ..."; docker: "running"
        if name.startswith("binome-") and word.isalpha():
            states[name[:64]] = "running" if word == "up" else word[:16]
    return states


def containers_watch(*, now: datetime | None = None) -> dict[str, int]:
    """Beat's watch: each host with ready or active windows (a capped batch) asked once for its containers' states;
    each of those windows' containers found stopped is decided on (restarted, left to its backoff, or held)."""
    now = now or timezone.now()
    watched = (
        Access.objects.filter(
            status=Access.Status.READY,
            order__status__in=[OrderStatus.READY, OrderStatus.ACTIVE],
            restarts_held_at__isnull=True,
            host__driver=Host.Driver.SSH,
        )
        .exclude(host__container_runtime="")
        .select_related("host")
        .order_by("host_id", "pk")
    )
    by_host: dict[int, list[Access]] = defaultdict(list)
    for access in watched[: HOSTS_PER_SWEEP * 16]:
        by_host[access.host_id].append(access)
    counts: dict[str, int] = defaultdict(int)
    for accesses in list(by_host.values())[:HOSTS_PER_SWEEP]:
        host = accesses[0].host
        try:
            with host_connect(host=host) as connection:
                states = container_states(connection, containers.Runtime(host.container_runtime))
        except DriverError as exc:
            logger.warning("container watch: %s unreachable: %s", host.name, exc.message)
            counts["unreachable"] += 1
            continue
        for access in accesses:
            state = states.get(f"binome-{access.username}")
            if state in STOPPED:
                counts[access_restart_due(access=access, now=now)] += 1
            else:
                counts["running" if state else "missing"] += 1
    return dict(counts)


@transaction.atomic
def access_restart_due(*, access: Access, now: datetime) -> str:
    """Decide on a container found stopped: "restarted" (a run of kind restart), "waiting" (its backoff is not
    over), "held" (the ceiling: left stopped, the operators told), "busy" (a run of the order works on its hosts,
    and starts or removes it itself) or "gone" (the window is over)."""
    order = lock_order(access.order_id)
    access = Access.objects.select_for_update().select_related("host").get(pk=access.pk)
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE) or access.status != Access.Status.READY:
        return "gone"
    if access.restarts_held_at:
        return "held"
    if order.provisioning_runs.filter(status__in=UNDER_WAY).exists():
        return "busy"
    count = access.restarts if access.restarted_at and now - access.restarted_at < RESTART_QUIET else 0
    host = access.host.name
    if count >= RESTART_LIMIT:
        Access.objects.filter(pk=access.pk).update(restarts_held_at=now)
        order_note(
            order=order,
            reason=f"container on {host} stopped again after {count} restarts: left stopped until an operator decides",
            actor_kind=OrderEvent.Actor.SYSTEM,
            evidence={"host": host, "restarts": count},
        )
        transaction.on_commit(
            lambda: notices.send(notices.Notice.CONTAINER_HELD, order=order, host_name=host, restarts=count)
        )
        logger.warning("container of %s on %s held after %s restarts", order.public_id, host, count)
        return "held"
    if count and now < access.restarted_at + restart_delay(count):
        return "waiting"
    Access.objects.filter(pk=access.pk).update(restarts=count + 1, restarted_at=now)
    run = container_restart_start(order=order, hosts=[access.host], actor=None)
    order_note(
        order=order,
        reason=f"container on {host} found stopped: started again ({count + 1} of at most {RESTART_LIMIT})",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={"host": host, "run": run.pk, "restarts": count + 1},
    )
    return "restarted"
