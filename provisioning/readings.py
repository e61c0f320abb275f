"""GPU readings during a window: once a minute, each host with running windows is asked for its GPUs'
utilisation, memory and power by its vendor's tool, and each access keeps the minute of its own cards.

The tools' answers are input like any other (a host may be compromised, a tool may print garbage): bounded, parsed
field by field, and a GPU that is not the access's is never stored for it. Nothing customer-controlled is read:
the tools are the host's, they report the devices, not the customers' files.
"""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime

from django.conf import settings
from django.db.models import Prefetch
from django.utils import timezone

from booking.models import OrderStatus
from inventory.models import Host
from provisioning.drivers.base import DriverError
from provisioning.hosts import host_connect
from provisioning.models import Access, GpuReading

logger = logging.getLogger(__name__)

NVIDIA_QUERY = [
    "--query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw",
    "--format=csv,noheader,nounits",
]
ROCM_QUERY = ["--showuse", "--showmeminfo", "vram", "--showpower", "--json"]
SAMPLE_TIMEOUT_S = 20
MAX_GPUS = 16
MAX_OUTPUT = 64 * 1024
HOSTS_PER_SWEEP = 50

Sample = list  # [index, utilisation %, memory used MiB, memory total MiB, power W]


def _number(text: object, *, scale: float = 1.0, limit: float = 1e7) -> float | None:
    """A finite, non-negative figure below `limit`, or None ("[N/A]", "[Not Supported]", garbage)."""
    try:
        value = float(str(text).strip()) * scale
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or value >= limit:
        return None
    return round(value, 1)


def parse_nvidia(text: str) -> dict[int, Sample]:
    """nvidia-smi's CSV (index, utilization.gpu, memory.used, memory.total, power.draw; no header, no units)."""
    samples = {}
    for line in text[:MAX_OUTPUT].splitlines()[: MAX_GPUS * 2]:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 5 or not fields[0].isdigit() or int(fields[0]) >= MAX_GPUS:
            continue
        index = int(fields[0])
        samples[index] = [
            index,
            _number(fields[1], limit=101),
            _number(fields[2]),
            _number(fields[3]),
            _number(fields[4], limit=100_000),
        ]
    return samples


def parse_rocm(text: str) -> dict[int, Sample]:
    """rocm-smi's JSON: {"card0": {"GPU use (%)": "12", "VRAM Total Memory (B)": "...", "VRAM Total Used Memory
    (B)": "...", "Average Graphics Package Power (W)": "..."}, ...}."""
    try:
        answer = json.loads(text[:MAX_OUTPUT])
    except ValueError:
        return {}
    if not isinstance(answer, dict):
        return {}
    samples = {}
    for card, values in list(answer.items())[: MAX_GPUS * 2]:
        if not (isinstance(card, str) and card.startswith("card") and card[4:].isdigit() and isinstance(values, dict)):
            continue
        index = int(card[4:])
        if index >= MAX_GPUS:
            continue
        power = next((value for key, value in values.items() if isinstance(key, str) and "Power (W)" in key), None)
        mib = 1 / (1024 * 1024)
        samples[index] = [
            index,
            _number(values.get("GPU use (%)"), limit=101),
            _number(values.get("VRAM Total Used Memory (B)"), scale=mib),
            _number(values.get("VRAM Total Memory (B)"), scale=mib),
            _number(power, limit=100_000),
        ]
    return samples


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
