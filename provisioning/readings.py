"""GPU readings during a window: once a minute, each host with running windows is asked for its GPUs'
utilisation, memory, power and temperature by its vendor's tool, and each access keeps the minute of its own cards.

The tools' answers are input like any other (a host may be compromised, a tool may print garbage): bounded, parsed
field by field, and a GPU that is not the access's is never stored for it. Nothing customer-controlled is read:
the tools are the host's, they report the devices, not the customers' files.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db.models import Prefetch
from django.utils import timezone

from booking.models import OrderStatus
from inventory.models import Host
from provisioning.drivers.base import DriverError
from provisioning.gpu_samples import parse_nvidia, parse_rocm
from provisioning.hosts import host_connect
from provisioning.models import Access, GpuReading

logger = logging.getLogger(__name__)

NVIDIA_QUERY = [
    "--query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu",
    "--format=csv,noheader,nounits",
]
ROCM_QUERY = ["--showuse", "--showmeminfo", "vram", "--showpower", "--showtemp", "--json"]
SAMPLE_TIMEOUT_S = 20
HOSTS_PER_SWEEP = 50


def gpu_tool_command(vendor: str) -> tuple[list[str], callable]:
    """The vendor's tool as the host runs it, and the parser of its answer (readings and the health check)."""
    tools = settings.PROVISIONING_GPU_TOOLS
    if vendor == "amd":
        return [tools["amd"], *ROCM_QUERY], parse_rocm
    return [tools["nvidia"], *NVIDIA_QUERY], parse_nvidia


def host_sample(*, host: Host, accesses: list[Access], now: datetime) -> int:
    """Ask the host once, keep each access's own GPUs for this minute. Returns the readings stored."""
    vendors = {access.order.hardware_class.vendor for access in accesses}
    minute = now.replace(second=0, microsecond=0)
    stored = 0
    try:
        with host_connect(host=host) as connection:
            if connection.is_dry_run:
                return 0
            for vendor in sorted(vendors):
                argv, parse = gpu_tool_command(vendor)
                result = connection.run(argv, timeout=SAMPLE_TIMEOUT_S, check=False)
                if result.exit_status != 0:
                    logger.warning("GPU readings on %s: %s exited %s", host.name, argv[0], result.exit_status)
                    continue
                samples = parse(result.stdout)
                for access in accesses:
                    if access.order.hardware_class.vendor != vendor:
                        continue
                    own = [samples[index] for index in access.gpu_index_list if index in samples]
                    if own:
                        _, created = GpuReading.objects.get_or_create(
                            access=access, taken_at=minute, defaults={"gpus": own}
                        )
                        stored += created
    except DriverError as exc:
        logger.warning("GPU readings on %s failed: %s", host.name, exc)
    return stored


def readings_sample(*, now: datetime | None = None) -> int:
    """Beat's minute: every host with a ready or active window, once each (bounded)."""
    now = now or timezone.now()
    running = Access.objects.filter(
        status=Access.Status.READY, order__status__in=[OrderStatus.READY, OrderStatus.ACTIVE]
    ).select_related("order__hardware_class")
    hosts = (
        Host.objects.filter(accesses__in=running)
        .distinct()
        .prefetch_related(Prefetch("accesses", queryset=running, to_attr="running"))[:HOSTS_PER_SWEEP]
    )
    return sum(host_sample(host=host, accesses=host.running, now=now) for host in hosts)
