"""How provisioning's services hand work to a worker: by the task's name, so that the services never import the
tasks that call them (provisioning/tasks.py imports the services; the app registers its tasks when ready,
provisioning/apps.py). Each function says when it queues: after the current transaction commits, or now (a sweep
outside a transaction, a receiver already running on commit, a caller that must know whether the broker took it)."""

from infrastructure.queues import after_commit, task


def execute_run(run_id: int) -> None:
    after_commit("provisioning.execute_run", run_id)


def execute_run_now(run_id: int) -> None:
    task("provisioning.execute_run").delay(run_id)


def check_host_now(host_id: int, actor_id: int | None) -> None:
    """Raises whatever the broker raises when it is unreachable: the caller marks the check as not queued."""
    task("provisioning.check_host").apply_async(args=[host_id, actor_id], retry=False)


def send_access_ready(order_id: int) -> None:
    after_commit("provisioning.send_access_ready", order_id)


def send_end_warning(order_id: int, kind: str) -> None:
    after_commit("provisioning.send_end_warning", order_id, kind)


def send_research_record(order_id: int) -> None:
    after_commit("provisioning.send_research_record", order_id)


def send_watch_alert(order_id: int, alert_id: int) -> None:
    after_commit("provisioning.send_watch_alert", order_id, alert_id)


def send_preflight_held(order_id: int) -> None:
    after_commit("provisioning.send_preflight_held", order_id)


def send_order_rejected_now(order_id: int) -> None:
    task("provisioning.send_order_rejected").delay(order_id)


def send_keys_changed(order_id: int, added: list, removed: list, applied: bool) -> None:
    after_commit("provisioning.send_keys_changed", order_id, added, removed, applied)


def send_order_moved(order_id: int, run_id: int, phase: str, *details) -> None:
    after_commit("provisioning.send_order_moved", order_id, run_id, phase, *details)
