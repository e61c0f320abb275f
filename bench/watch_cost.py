"""What watching running windows costs the worker: per host and per minute, with 4 windows on the host.

    .venv/bin/python bench/watch_cost.py [--minutes 30]     # as root (it starts an sshd); PostgreSQL up

On a real sshd on 127.0.0.1, one host with four B200 lots (GPUs 0-7) and four running windows, each with three hours
of minute readings already stored (the idle watch's longest look back) and a checkpoint directory. Every simulated
minute runs what beat runs: the readings' sample (one SSH connection, the host's nvidia-smi: here a stand-in printing
its CSV for eight GPUs), then the readings' watch (an unbalanced split, idle cards) over the last three hours. The
checkpoint watch reads each window's directory once per its interval (1 hour here): its sweep is timed on its own
and spread over the interval's minutes. The container runtime is a stand-in that answers as the in-container script
does (it prints a time): the SSH round trip and the database work are real, the container's `find` is not.

Prints the worker's wall time (what a worker slot is busy) and CPU time (what the worker process itself computes) per
host-minute, median and 95th percentile, and what 100 hosts would ask of one worker per minute. Sizing, not a target.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/binome_watchbench")
WINDOWS = 4
LOOK_BACK_MINUTES = 180
NVIDIA_SMI = "".join(
    f"{gpu}, {97 if gpu % 2 == 0 else 3}, {171234 if gpu % 2 == 0 else 2210}, 184320, 700.5, {60 + gpu}\n"
    for gpu in range(2 * WINDOWS)
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=30)
    options = parser.parse_args()

    from pages import recreate_database

    recreate_database(DATABASE_URL)
    tools = Path(tempfile.mkdtemp(prefix="binome-bench-tools-"))
    tools.chmod(0o755)
    smi = tools / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'END'\n{NVIDIA_SMI}END\n")
    runtime = tools / "podman"  # answers `podman exec … sh -c SCRIPT sh DIR` as the script would: one time
    runtime.write_text("#!/bin/sh\ndate +%s\n")
    for tool in (smi, runtime):
        tool.chmod(0o755)
    env = {
        **os.environ,
        "DEBUG": "1",
        "DATABASE_URL": DATABASE_URL,
        "PROVISIONING_NVIDIA_SMI": str(smi),
        "LOG_LEVEL": "WARNING",
        "EMAIL_URL": "dummymail://",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    os.environ.update(env)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if migrate.returncode:
        sys.exit(f"migrate failed:\n{migrate.stderr}")
    import django

    django.setup()
    from django.conf import settings

    from tests.provisioning.conftest import running_sshd

    with running_sshd() as sshd:
        settings.PROVISIONING_SSH_KEY_FILE = str(sshd.host_spec.client_key_path)
        measure(sshd, str(runtime), options.minutes)


def _windows(sshd, runtime: str):
    """One host, four lots, four running windows with their accesses ready and three hours of readings."""
    from django.core.cache import cache
    from django.utils import timezone

    from booking.models import BookingPolicy, EnvironmentImage, Order, OrderStatus
    from booking.placing import BookingRequest, Contact, Research
    from booking.selectors import earliest_start_date
    from booking.ssh_keys import parse_public_key
    from booking.terms import terms_current
    from inventory.models import HardwareClass, Host, Lot
    from payments.checkout import order_place
    from provisioning.demo import seed_demo_catalog
    from provisioning.models import Access, GpuReading
    from tests.factories import make_ssh_key

    seed_demo_catalog()
    cache.clear()
    b200 = HardwareClass.objects.get(slug="b200-pair")
    host = Host.objects.create(
        name="loopback",
        address="127.0.0.1",
        ssh_port=sshd.port,
        driver=Host.Driver.SSH,
        host_key=sshd.host_key_line,
        container_runtime=runtime,
    )
    Lot.objects.filter(hardware_class=b200).update(status=Lot.Status.MAINTENANCE)
    for window in range(WINDOWS):
        Lot.objects.create(
            name=f"loopback · GPUs {2 * window},{2 * window + 1}",
            hardware_class=b200,
            host=host,
            gpu_indices=f"{2 * window},{2 * window + 1}",
        )
    now = timezone.now().replace(second=0, microsecond=0)
    for window in range(WINDOWS):
        order, _token = order_place(
            request=BookingRequest(
                hardware_class=b200,
                environment=EnvironmentImage.objects.get(slug="pytorch-2-7-cuda-12-8"),
                lot_count=1,
                start_date=earliest_start_date(policy=BookingPolicy.current()),
                days=30,
                contact=Contact(name="Bench", email=f"bench{window}@example.org", organisation="Bench"),
                ssh_keys=[parse_public_key(make_ssh_key())],
                terms_version_id=terms_current().pk,
                research=Research(
                    hypothesis="bigger_batch",
                    detail="Bench",
                    measure="Watch cost",
                    checkpoint_interval_hours=1,
                    stop_criteria="bench",
                    checkpoint_dir="ckpt",
                ),
                contact_confirmed=True,
            )
        )
        lot = order.allocations.get().lot
        Order.objects.filter(pk=order.pk).update(status=OrderStatus.ACTIVE, starts_at=now - timedelta(days=1))
        access = Access.objects.create(
            order=order,
            host=host,
            username=f"bn-bench{window}",
            gpu_indices=lot.gpu_indices,
            status=Access.Status.READY,
            ready_at=now - timedelta(days=1),
        )
        first, second = lot.gpu_index_list
        GpuReading.objects.bulk_create(
            GpuReading(
                access=access,
                taken_at=now - timedelta(minutes=minute),
                gpus=[[first, 55, 90000, 184320, 500.0, 60], [second, 55, 90000, 184320, 500.0, 61]],
            )
            for minute in range(1, LOOK_BACK_MINUTES + 1)
        )
    return now


def measure(sshd, runtime: str, minutes: int) -> None:
    from provisioning import readings, watch

    now = _windows(sshd, runtime)
    walls, cpus, stored, opened = [], [], 0, 0
    for minute in range(minutes):
        at = now + timedelta(minutes=minute, seconds=5)
        wall, cpu = time.perf_counter(), time.process_time()
        stored += readings.readings_sample(now=at)
        opened += watch.watch_readings(now=at)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    sweeps = []
    for hour in range(3):
        at = now + timedelta(hours=hour + 1)
        wall, cpu = time.perf_counter(), time.process_time()
        counts = watch.watch_checkpoints(now=at)
        sweeps.append((time.perf_counter() - wall, time.process_time() - cpu))
    assert counts.get("ok") == WINDOWS, counts

    def ms(values, q=None):
        return (statistics.quantiles(values, n=20)[18] if q else statistics.median(values)) * 1000

    check_wall = statistics.median(wall for wall, _cpu in sweeps)
    check_cpu = statistics.median(cpu for _wall, cpu in sweeps)
    per_minute_wall = statistics.median(walls) + check_wall / 60
    per_minute_cpu = statistics.median(cpus) + check_cpu / 60
    print(f"{WINDOWS} windows on one host, {minutes} minutes; {stored} readings stored, {opened} alerts opened")
    print(
        f"readings' sample + watch, per host-minute: wall median {ms(walls):.1f} ms (p95 {ms(walls, 95):.1f}), "
        f"worker CPU median {ms(cpus):.1f} ms (p95 {ms(cpus, 95):.1f})"
    )
    hourly = f"wall {check_wall * 1000:.1f} ms, CPU {check_cpu * 1000:.1f} ms"
    print(
        f"checkpoint sweep of the host's {WINDOWS} directories (once an hour each): {hourly}; "
        f"spread over the hour: {check_wall / 60 * 1000:.2f} ms a minute"
    )
    print(f"watching, per host-minute: wall {per_minute_wall * 1000:.1f} ms, CPU {per_minute_cpu * 1000:.1f} ms")
    print(
        f"100 hosts: {per_minute_wall * 100:.1f} worker-seconds each minute ({per_minute_wall * 100 / 60:.0%} of "
        f"one worker slot), of which {per_minute_cpu * 100:.1f} s of CPU"
    )


if __name__ == "__main__":
    main()
