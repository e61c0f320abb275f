"""Provisioning's reads: the share of a host each lot's container gets, in the form podman takes it."""

from decimal import Decimal

import pytest
from django.db import IntegrityError

from inventory.models import Host
from provisioning.selectors import container_limits

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("cpus", "memory_gib", "shm_gib", "expected"),
    [
        (None, 0, 8, {"cpus": "", "memory": "", "shm_size": "8g"}),
        (Decimal("0"), 0, 8, {"cpus": "", "memory": "", "shm_size": "8g"}),  # 0: not limited
        (Decimal("16"), 128, 16, {"cpus": "16", "memory": "128g", "shm_size": "16g"}),
        (Decimal("7.50"), 61, 1, {"cpus": "7.5", "memory": "61g", "shm_size": "1g"}),
        (Decimal("0.25"), 1, 1, {"cpus": "0.25", "memory": "1g", "shm_size": "1g"}),
        (Decimal("1000"), 16384, 1024, {"cpus": "1000", "memory": "16384g", "shm_size": "1024g"}),
    ],
)
def test_container_limits_are_podman_arguments(cpus, memory_gib, shm_gib, expected):
    host = Host.objects.create(
        name="gpu-9", address="gpu-9.invalid", cpus_per_lot=cpus, memory_per_lot_gib=memory_gib, shm_size_gib=shm_gib
    )
    host.refresh_from_db()  # as the lead's steps read it: Decimal from the database, not what was passed

    assert container_limits(host) == {**expected, "connections": 0, "ptys": 0, "disk_mbps": 0}


def test_a_new_host_gets_an_unlimited_share_and_8_gib_of_shared_memory():
    host = Host.objects.create(name="gpu-8", address="gpu-8.invalid")

    assert container_limits(host) == {
        "cpus": "", "memory": "", "shm_size": "8g", "connections": 0, "ptys": 0, "disk_mbps": 0
    }  # fmt: skip


def test_the_shares_of_what_tenants_draw_from_are_per_lot_and_multiplied_by_the_container_s_lots():
    host = Host.objects.create(
        name="gpu-6", address="gpu-6.invalid", connections_per_lot=50_000, ptys_per_lot=256, disk_mbps_per_lot=400
    )

    limits = container_limits(host, lots=2)

    assert (limits["connections"], limits["ptys"], limits["disk_mbps"]) == (100_000, 512, 800)


@pytest.mark.parametrize(
    "values",
    [
        {"cpus_per_lot": Decimal("-1")},
        {"cpus_per_lot": Decimal("5000")},
        {"memory_per_lot_gib": 10**7},
        {"shm_size_gib": 0},
        {"shm_size_gib": 5000},
        {"connections_per_lot": 10**8},
        {"ptys_per_lot": 10**6},
        {"disk_mbps_per_lot": 10**6},
    ],
)
def test_the_database_refuses_shares_out_of_range(values):
    host = Host.objects.create(name="gpu-7", address="gpu-7.invalid")

    with pytest.raises(IntegrityError):
        Host.objects.filter(pk=host.pk).update(**values)
