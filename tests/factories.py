"""Builders for test data that the catalog seed does not provide."""

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from inventory.models import HardwareClass, Host, Lot

# The research fields of the booking form (the offer page's method), answered as a researcher would.
RESEARCH_ANSWERS = {
    "sharing": "full_copy",
    "hypothesis": "bigger_batch",
    "hypothesis_detail": "Global batch 2048 instead of 1024 should shorten time to target loss.",
    "hypothesis_measure": "Examples per second and loss against examples seen, one card then two.",
}


def make_ssh_key(comment: str = "researcher@lab") -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}"


def add_lots(hardware_class: HardwareClass, count: int, *, host_prefix: str = "bulk") -> None:
    """Add `count` active lots of the class on new hosts (8 lots per host, as a real fleet would be)."""
    hosts = Host.objects.bulk_create(
        Host(name=f"{host_prefix}-{index:04d}", address=f"{host_prefix}-{index:04d}.invalid")
        for index in range((count + 7) // 8)
    )
    Lot.objects.bulk_create(
        Lot(
            name=f"{hosts[index // 8].name} · GPUs {2 * (index % 8)},{2 * (index % 8) + 1}",
            hardware_class=hardware_class,
            host=hosts[index // 8],
            gpu_indices=f"{2 * (index % 8)},{2 * (index % 8) + 1}",
        )
        for index in range(count)
    )
