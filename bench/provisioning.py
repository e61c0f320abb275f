"""Approval → access ready, on a real sshd on 127.0.0.1, with a real Celery worker on Redis.

    .venv/bin/python bench/provisioning.py [--trials 5]     # as root (sshd, useradd); PostgreSQL and Redis up

Measures, per trial, the time from the operator's approval (the order's window starting within the lead time, so
the approval starts provisioning at once) to the access being ready: the provision run (host, account, data volume,
image pinned, container, pre-flight inside), then the hand-over run (keys, the container's sshd answering). On this
machine without a GPU the pre-flight fails and the hand-over waits for an operator: the bench hands over at once and
counts the provision and hand-over runs, not the wait. Then the customer's login to their container's SSH server
must work. A host running podman (runc), the image already present, mknod stand-ins for /dev/nvidia0..3. Target
(issues 4, 12 and 18): <= 10 s, image pull aside.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_provbench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    options = parser.parse_args()

    import psycopg

    name = DATABASE_URL.rsplit("/", 1)[1]
    with psycopg.connect(DATABASE_URL.rsplit("/", 1)[0] + "/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    from tests.processes import stop_process_groups, worker_argv
    from tests.provisioning.conftest import running_sshd, stand_in_gpus

    with stand_in_gpus() as gpus, running_sshd(containers=True) as sshd:
        env = {
            "PROVISIONING_DEVICE_DIR": str(gpus),
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": DATABASE_URL,
            "REDIS_URL": REDIS_URL,
            "PROVISIONING_SSH_KEY_FILE": str(sshd.host_spec.client_key_path),
            "LOG_LEVEL": "WARNING",
            "EMAIL_URL": "dummymail://",
            "PROVISIONING_PUBLISH_ADDRESS": "127.0.0.1",
        }
        os.environ.update(env)
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if migrate.returncode:
            sys.exit(f"migrate failed:\n{migrate.stderr}")
        import django

        os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
        django.setup()
        worker = subprocess.Popen(
            worker_argv(),
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        try:
            run_trials(sshd, options.trials, runtime="podman")
        finally:
            stop_process_groups([worker])


def run_trials(sshd, trials: int, runtime: str) -> None:
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    from booking.models import BookingPolicy, EnvironmentImage, OrderStatus
    from booking.placing import BookingRequest, Contact, Research
    from booking.selectors import earliest_start_date
    from booking.ssh_keys import parse_public_key
    from booking.terms import terms_current
    from inventory.models import HardwareClass, Host, Lot
    from payments.checkout import order_place
    from payments.selectors import current_invoice
    from payments.settlement import invoice_mark_paid
    from portal.celery import app as celery_app
    from provisioning import rules, runs, services
    from provisioning.demo import seed_demo_catalog
    from provisioning.drivers import get_driver
    from provisioning.models import Access, OperatorSettings
    from tests.provisioning.conftest import customer_ssh, generate_keypair, remove_user

    celery_app.control.purge()
    seed_demo_catalog()
    cache.clear()
    # The image is already present (no registry is reachable): the test image under the environment's name.
    image = subprocess.run([str(ROOT / "bin" / "test-image")], capture_output=True, text=True, check=True).stdout
    reference = EnvironmentImage.objects.get(slug="pytorch-2-7-cuda-12-8").image_ref
    subprocess.run(["podman", "tag", image.strip(), reference], check=True, capture_output=True)
    b200 = HardwareClass.objects.get(slug="b200-pair")
    host = Host.objects.create(
        name="loopback",
        address="127.0.0.1",
        ssh_port=sshd.port,
        driver=Host.Driver.SSH,
        host_key=sshd.host_key_line,
        container_runtime=runtime,
        disk_per_lot_gib=1,
    )
    Lot.objects.filter(hardware_class=b200).update(status=Lot.Status.MAINTENANCE)
    Lot.objects.create(name="loopback · GPUs 0,1", hardware_class=b200, host=host, gpu_indices="0,1")
    policy = BookingPolicy.current()
    # Trial k's window starts 12k days after the earliest date: within a lead time this long, approval provisions
    # every trial at once.
    lead_hours = 24 * (12 * trials + 28)
    OperatorSettings.objects.update_or_create(pk=1, defaults={"provision_lead_hours": lead_hours})
    admin = get_user_model().objects.create_superuser("bench", "bench@example.org", "bench-password-long")
    keys_dir = Path(tempfile.mkdtemp(prefix="binome-bench-keys-"))
    totals, by_step = [], {}
    mode = f"containers ({runtime}, runc), SSH inside each"
    print(f"sshd on 127.0.0.1:{sshd.port}; host mode: {mode}; worker on {REDIS_URL}; database {DATABASE_URL}")
    for trial in range(trials):
        private_key, public_key = generate_keypair(keys_dir / f"customer{trial}")
        order, _token = order_place(
            request=BookingRequest(
                hardware_class=b200,
                environment=EnvironmentImage.objects.get(slug="pytorch-2-7-cuda-12-8"),
                lot_count=1,
                start_date=earliest_start_date(policy=policy) + timedelta(days=12 * trial),
                days=7,
                contact=Contact(name="Bench", email="bench@example.org", organisation="Bench"),
                ssh_keys=[parse_public_key(public_key)],
                terms_version_id=terms_current().pk,
                research=Research(hypothesis="bigger_batch", detail="Bench", measure="Provisioning time"),
                contact_confirmed=True,  # a researcher with a confirmed address: the booking desk's share aside
            )
        )
        invoice_mark_paid(invoice=current_invoice(order), user=admin, reason="bench")
        username = rules.username_for(order)
        started = time.perf_counter()
        services.order_approve(order=order, actor=admin)
        provisioned = _wait(order, (OrderStatus.READY, OrderStatus.PROVISIONING_FAILED)) - started
        handover_started = time.perf_counter()
        if order.status == OrderStatus.PROVISIONING_FAILED and rules.awaits_preflight_decision(order):
            runs.provisioning_hand_over(order=order, actor=admin, reason="bench: no GPU on this machine")
        ready = provisioned + _wait(order, (OrderStatus.READY,)) - handover_started
        access = Access.objects.select_related("host").get(order=order)
        login = customer_ssh(access, private_key, "echo $(hostname) $(ls /dev | grep -c nvidia)")
        totals.append(ready)
        for run in order.provisioning_runs.all():
            for step in run.steps.all():
                by_step.setdefault(f"{run.kind}:{step.name}", []).append(step.duration_s or 0.0)
        print(
            f"trial {trial + 1}: {order.public_id} {order.status} in {ready:.2f} s; customer login "
            f"{'ok: ' + login.stdout.strip() if login.returncode == 0 else 'FAILED ' + login.stderr.strip()[-200:]}"
        )
        with get_driver("ssh").connect(sshd.host_spec) as connection:
            remove_user(connection, username)
    subprocess.run(["podman", "untag", image.strip(), reference], check=False, capture_output=True)
    print()
    print(
        "step durations, median s: "
        + ", ".join(f"{name} {statistics.median(values):.2f}" for name, values in by_step.items())
    )
    print(
        f"approval -> access ready: median {statistics.median(totals):.2f} s, max {max(totals):.2f} s "
        f"(target <= 10 s: {'met' if max(totals) <= 10 else 'NOT met'})"
    )


def _wait(order, statuses, limit_s: float = 120) -> float:
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        order.refresh_from_db()
        if order.status in statuses:
            break
        time.sleep(0.02)
    return time.perf_counter()


if __name__ == "__main__":
    main()
