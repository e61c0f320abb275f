"""The demo catalog, fleet and operator of `make run` (manage.py seed_demo). Idempotent. Development only:
the hosts use the dry-run driver and the operator's password is printed."""

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import transaction

from booking.models import BookingPolicy, EnvironmentImage, Price
from booking.terms import terms_seed_demo
from inventory.models import HardwareClass, Host, Lot, Runtime, Vendor

DEMO_OPERATOR_USERNAME = "operator"
DEMO_OPERATOR_PASSWORD = "binome-demo-operator"  # noqa: S105 (demo only; seed_demo refuses to run without DEBUG)
OPERATORS_GROUP = "operators"

CLASSES = [
    {
        "slug": "b200-pair",
        "name": "NVIDIA B200 pair",
        "vendor": Vendor.NVIDIA,
        "gpu_model": "B200",
        "memory_per_card_gb": 180,
        "cards_per_lot": 2,
        "interconnect": "NVLink 5",
        "architecture": "sm_100",
        "min_runtime_version": "12.8",
        "summary": "Blackwell. The default lot: two cards of 180 GB joined by NVLink.",
        "is_default": True,
        "position": 0,
        "prices": {3: "1450.00", 7: "3150.00", 30: "12600.00"},
        "hosts": {"b200-node-01": ["0,1", "2,3"], "b200-node-02": ["0,1", "2,3"], "b200-node-03": ["0,1", "2,3"]},
    },
    {
        "slug": "h200-pair",
        "name": "NVIDIA H200 pair",
        "vendor": Vendor.NVIDIA,
        "gpu_model": "H200",
        "memory_per_card_gb": 141,
        "cards_per_lot": 2,
        "interconnect": "NVLink 4",
        "architecture": "sm_90",
        "min_runtime_version": "11.8",
        "summary": "Hopper. When the model and its runtime reserve fit 141 GB, one card runs it alone.",
        "is_default": False,
        "position": 1,
        "prices": {3: "980.00", 7: "2120.00", 30: "8400.00"},
        "hosts": {"h200-node-01": ["0,1", "2,3"]},
    },
    {
        "slug": "mi300x-pair",
        "name": "AMD MI300X pair",
        "vendor": Vendor.AMD,
        "gpu_model": "MI300X",
        "memory_per_card_gb": 192,
        "cards_per_lot": 2,
        "interconnect": "Infinity Fabric",
        "architecture": "gfx942",
        "min_runtime_version": "6.0",
        "summary": "CDNA 3, for projects prepared for ROCm.",
        "is_default": False,
        "position": 2,
        "prices": {3: "760.00", 7: "1650.00", 30: "6500.00"},
        "hosts": {"mi300x-node-01": ["0,1"]},
    },
]

ENVIRONMENTS = [
    {
        "slug": "pytorch-2-7-cuda-12-8",
        "name": "PyTorch 2.7 · CUDA 12.8",
        "image_ref": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-devel",
        "runtime": Runtime.CUDA,
        "runtime_version": "12.8",
        "pytorch_version": "2.7.1",
        "classes": ["b200-pair", "h200-pair"],
        "position": 0,
    },
    {
        "slug": "pytorch-2-4-cuda-12-4",
        "name": "PyTorch 2.4 · CUDA 12.4",
        "image_ref": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-devel",
        "runtime": Runtime.CUDA,
        "runtime_version": "12.4",
        "pytorch_version": "2.4.1",
        "classes": ["h200-pair"],
        "position": 1,
    },
    {
        "slug": "pytorch-2-6-rocm-6-4",
        "name": "PyTorch 2.6 · ROCm 6.4",
        "image_ref": "rocm/pytorch:rocm6.4_ubuntu24.04_py3.12_pytorch_release_2.6.0",
        "runtime": Runtime.ROCM,
        "runtime_version": "6.4",
        "pytorch_version": "2.6.0",
        "classes": ["mi300x-pair"],
        "position": 2,
    },
]


@transaction.atomic
def seed_demo_catalog() -> dict[str, int]:
    BookingPolicy.current()
    terms_seed_demo()  # migration 0006 seeds it; a database flushed since (tests) gets it again
    classes = {}
    for spec in CLASSES:
        spec = dict(spec)
        prices, hosts = spec.pop("prices"), spec.pop("hosts")
        hardware_class, _created = HardwareClass.objects.update_or_create(slug=spec.pop("slug"), defaults=spec)
        classes[hardware_class.slug] = hardware_class
        for days, amount in prices.items():
            Price.objects.update_or_create(
                hardware_class=hardware_class, days=days, defaults={"amount_per_lot": Decimal(amount)}
            )
        for host_name, gpu_groups in hosts.items():
            host, _created = Host.objects.get_or_create(
                name=host_name,
                defaults={
                    "address": f"{host_name}.demo.invalid",
                    "driver": Host.Driver.DRY_RUN,
                    "isolation_mode": Host.Isolation.DRY_RUN,  # never probed: labelled as such, not as isolated
                },
            )
            for gpu_indices in gpu_groups:
                Lot.objects.get_or_create(
                    host=host,
                    gpu_indices=gpu_indices,
                    defaults={
                        "name": f"{host_name} · GPUs {gpu_indices}",
                        "hardware_class": hardware_class,
                    },
                )
    for spec in ENVIRONMENTS:
        spec = dict(spec)
        class_slugs = spec.pop("classes")
        environment, _created = EnvironmentImage.objects.update_or_create(slug=spec.pop("slug"), defaults=spec)
        environment.hardware_classes.set([classes[slug] for slug in class_slugs])
    return {"classes": HardwareClass.objects.count(), "lots": Lot.objects.count()}


# The operators' group: the console, payment review, and read access to the admin's raw data.
OPERATOR_PERMISSIONS = [
    ("booking", "operate_orders"),
    ("payments", "review_payments"),
    ("booking", "view_order"),
    ("booking", "view_orderevent"),
    ("inventory", "view_lot"),
    ("payments", "view_invoice"),
    ("payments", "view_transfer"),
    ("inventory", "view_host"),
    ("provisioning", "view_provisioningrun"),
    ("provisioning", "view_access"),
]


@transaction.atomic
def seed_operators_group() -> Group:
    group, _created = Group.objects.get_or_create(name=OPERATORS_GROUP)
    for app_label, codename in OPERATOR_PERMISSIONS:
        group.permissions.add(Permission.objects.get(codename=codename, content_type__app_label=app_label))
    return group


@transaction.atomic
def seed_demo_operator() -> None:
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username=DEMO_OPERATOR_USERNAME, defaults={"is_staff": True, "email": "operator@binome.invalid"}
    )
    if created:
        user.set_password(DEMO_OPERATOR_PASSWORD)
        user.save()
    user.groups.add(seed_operators_group())
