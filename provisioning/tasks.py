"""Thin Celery wrappers for the provisioning queue."""

from celery import shared_task

from booking.models import Order
from provisioning import execution, health, hosts, lifecycle, readings, research_record, restarts, services, watch
from provisioning.models import ProvisioningRun, WatchAlert


@shared_task(name="provisioning.execute_run", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=60)
def execute_run(self, run_id: int) -> str:
    run = ProvisioningRun.objects.filter(pk=run_id).first() if isinstance(run_id, int) else None
    if run is None:
        return "unknown"
    status = execution.run_execute(run=run)
    if status == "waiting" and not self.request.is_eager:  # another run of the order is at work: after it
        raise self.retry(countdown=10)
    return status


@shared_task(name="provisioning.lifecycle_tick")
def lifecycle_tick() -> dict:
    return lifecycle.lifecycle_tick()


@shared_task(name="provisioning.send_access_ready", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_access_ready(order_id: int) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    if order is not None:
        execution.access_email_send(order=order)


@shared_task(name="provisioning.send_end_warning", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_end_warning(order_id: int, kind: str) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    if order is not None and kind in {kind for kind, _before in lifecycle.WARNINGS}:
        lifecycle.end_warning_send(order=order, kind=kind)


@shared_task(name="provisioning.send_research_record", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_research_record(order_id: int) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    if order is not None:
        research_record.record_send(order=order)


@shared_task(name="provisioning.send_watch_alert", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_watch_alert(order_id: int, alert_id: int) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    alert = WatchAlert.objects.filter(pk=alert_id, order=order).first() if isinstance(alert_id, int) else None
    if order is not None and alert is not None:
        watch.watch_alert_send(order=order, alert=alert)


@shared_task(name="provisioning.send_preflight_held", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_preflight_held(order_id: int) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    if order is not None:
        execution.preflight_held_email_send(order=order)


@shared_task(name="provisioning.send_order_rejected", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_order_rejected(order_id: int) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    if order is not None:
        services.order_rejected_email_send(order=order)


@shared_task(name="provisioning.send_keys_changed", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_keys_changed(order_id: int, added: list, removed: list, applied: bool) -> None:
    order = Order.objects.filter(pk=order_id).first() if isinstance(order_id, int) else None
    if order is not None and isinstance(added, list) and isinstance(removed, list):
        services.keys_changed_email_send(order=order, added=added, removed=removed, applied=applied)


@shared_task(name="provisioning.send_order_moved", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_order_moved(
    order_id: int, run_id: int, stage: str, data_kept: bool = False, credit: str = "", hours_lost: int = 0
) -> None:
    valid = all(isinstance(value, int) for value in (order_id, run_id, hours_lost)) and isinstance(data_kept, bool)
    order = Order.objects.filter(pk=order_id).first() if valid and isinstance(credit, str) else None
    if order is not None:
        execution.order_moved_email_send(
            order=order, run_id=run_id, stage=stage, data_kept=data_kept, credit=credit, hours_lost=hours_lost
        )


@shared_task(name="provisioning.sample_readings", expires=55)
def sample_readings() -> int:
    """The minute's readings, then what they show (an unbalanced split, idle cards)."""
    stored = readings.readings_sample()
    watch.watch_readings()
    return stored


@shared_task(name="provisioning.check_host")
def check_host(host_id: int, actor_id: int | None = None) -> str:
    """An operator's "check host" (provisioning/hosts.py host_check_request)."""
    if not isinstance(host_id, int) or not (actor_id is None or isinstance(actor_id, int)):
        return "unknown"
    return hosts.host_check_run(host_id=host_id, actor_id=actor_id)


@shared_task(name="provisioning.check_hosts")
def check_hosts() -> dict:
    return hosts.hosts_check_due()


@shared_task(name="provisioning.check_hosts_health", expires=240)
def check_hosts_health() -> dict:
    return health.hosts_health_check()


@shared_task(name="provisioning.watch_checkpoints", expires=240)
def watch_checkpoints() -> dict:
    return watch.watch_checkpoints()


@shared_task(name="provisioning.watch_containers", expires=55)
def watch_containers() -> dict:
    return restarts.containers_watch()
