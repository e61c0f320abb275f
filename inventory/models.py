"""The fleet: what a lot is made of (hardware classes), the hosts, and the lots, each a slice of one host's GPUs.

Hosts and lots belong together: a lot is a slice of a host, so they live in one app at the bottom of the graph
(docs/architecture.md, "Layers"). Booking sells lots, provisioning prepares them on their host; neither owns them.
"""

import re
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from inventory.rules import RUNTIME_PATTERN


def version_tuple(version: str) -> tuple[int, ...]:
    """'12.8' -> (12, 8); '6.2.4' -> (6, 2, 4). Non-numeric parts end the version."""
    parts = []
    for part in version.strip().split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def validate_version(value: str) -> None:
    if not re.fullmatch(r"\d+(\.\d+){0,3}", value.strip()):
        raise ValidationError(_("Write a version as numbers separated by dots, e.g. 12.8 or 6.2.4."))


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"


class Runtime(models.TextChoices):
    CUDA = "cuda", "CUDA"
    ROCM = "rocm", "ROCm"


RUNTIME_OF_VENDOR = {Vendor.NVIDIA: Runtime.CUDA, Vendor.AMD: Runtime.ROCM}


class HardwareClass(models.Model):
    """What a lot is made of: e.g. a pair of NVIDIA B200 (2 × 180 GB, sm_100, NVLink)."""

    slug = models.SlugField(_("slug"), max_length=40, unique=True)
    name = models.CharField(_("name"), max_length=100)
    vendor = models.CharField(_("vendor"), max_length=16, choices=Vendor.choices)
    gpu_model = models.CharField(_("GPU model"), max_length=40)
    memory_per_card_gb = models.PositiveIntegerField(_("memory per card (GB)"))
    cards_per_lot = models.PositiveSmallIntegerField(_("cards per lot"), default=2)
    interconnect = models.CharField(_("interconnect"), max_length=100)
    architecture = models.CharField(
        _("architecture"), max_length=20, help_text=_("Compute target, e.g. sm_100 (Blackwell), sm_90, gfx942.")
    )
    min_runtime_version = models.CharField(
        _("minimum CUDA or ROCm version"),
        max_length=20,
        validators=[validate_version],
        help_text=_("The oldest CUDA (NVIDIA) or ROCm (AMD) release that targets this architecture."),
    )
    summary = models.CharField(_("summary"), max_length=300, blank=True)
    is_default = models.BooleanField(_("default class"), default=False)
    is_active = models.BooleanField(_("offered"), default=True)
    position = models.PositiveSmallIntegerField(_("position"), default=0)

    class Meta:
        ordering = ["position", "name"]
        verbose_name = _("hardware class")
        verbose_name_plural = _("hardware classes")
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_class"),
            models.CheckConstraint(condition=Q(cards_per_lot__gte=1), name="class_has_cards"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def runtime(self) -> str:
        return RUNTIME_OF_VENDOR[self.vendor]

    @property
    def lot_memory_gb(self) -> int:
        return self.memory_per_card_gb * self.cards_per_lot


MAX_CPUS_PER_LOT = 1024
MAX_MEMORY_PER_LOT_GIB = 16384  # 16 TiB: more than any host of the fleet, less than what overflows podman
MAX_SHM_GIB = 1024
MAX_CONNECTIONS_PER_LOT = 10_000_000  # the kernel's connection-tracking table is sized in the hundreds of thousands
MAX_PTYS_PER_LOT = 65536
MAX_DISK_MBPS_PER_LOT = 100_000


class Isolation(models.TextChoices):
    """How a host keeps one lot's customer away from another's GPUs and files (docs/operations.md)."""

    UNCHECKED = "unchecked", _("Not checked yet")
    CONTAINER = "container", _("Container per order")
    EXCLUSIVE = "exclusive", _("One lot on the host")
    DEVICE_PERMISSIONS = "device_permissions", _("GPU device permissions")
    NOT_ISOLATED = "not_isolated", _("Not isolated")
    DRY_RUN = "dry_run", _("Dry run (demo, not probed)")


# The modes in which a host's lots are offered: every order in a container of its own (or the demo's dry run). The
# exclusive and device-permission modes of the earlier design gave customers an account on the host: rows that still
# say so offer nothing. An unchecked host is offered when it can only run containers (its runtime is set, and its
# provisioning checks its login stack before anything else) or is a dry run; the console shows it as to be checked.
OFFERING_MODES = [Isolation.CONTAINER, Isolation.DRY_RUN]


class HealthStatus(models.TextChoices):
    UNKNOWN = "unknown", _("Not checked yet")
    OK = "ok", _("Healthy")
    FAILING = "failing", _("Failing")


class Host(models.Model):
    """A GPU node of the fleet, reached by a provisioning driver. Its lots are slices of it."""

    Isolation = Isolation
    HealthStatus = HealthStatus

    class Driver(models.TextChoices):
        DRY_RUN = "dry_run", _("Dry run (demo: records what it would do)")
        SSH = "ssh", _("SSH")

    name = models.SlugField(_("name"), max_length=63, unique=True)
    address = models.CharField(_("address"), max_length=255, help_text=_("Hostname or IP address for SSH."))
    ssh_port = models.PositiveIntegerField(
        _("SSH port"), default=22, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    driver = models.CharField(_("driver"), max_length=16, choices=Driver.choices, default=Driver.DRY_RUN)
    admin_user = models.CharField(
        _("admin user"), max_length=32, default="root", help_text=_("Account the portal logs in as (root or a sudoer).")
    )
    use_sudo = models.BooleanField(_("prefix commands with sudo"), default=False)
    container_runtime = models.CharField(
        _("container runtime"),
        max_length=200,
        blank=True,
        validators=[
            RegexValidator(
                f"^{RUNTIME_PATTERN}$",
                _("Give podman or docker, as a name or an absolute path."),
            )
        ],
        help_text=_(
            "podman or docker: each order runs in a container of its image, in a network of its own, and customers "
            "log in to an SSH server inside it. Empty: the host's lots are not offered."
        ),
    )
    ssh_port_base = models.PositiveIntegerField(
        _("first customer SSH port"),
        default=42000,
        validators=[MinValueValidator(1024), MaxValueValidator(65000)],
        help_text=_(
            "Each order's container publishes its SSH server on this port plus the index of its lot's first GPU "
            "(42000 to 42007 on an eight-GPU host). Open these ports in the host's firewall."
        ),
    )
    disk_per_lot_gib = models.PositiveIntegerField(
        _("data disk per lot (GiB)"),
        default=0,
        validators=[MaxValueValidator(1024 * 1024)],
        help_text=_(
            "Size of each lot's data volume (the customer's home); 0: the host's volume disk split over its lots."
        ),
    )
    ready_within_minutes = models.PositiveSmallIntegerField(
        _("ready within (minutes)"),
        default=60,
        validators=[MinValueValidator(10), MaxValueValidator(24 * 60)],
        help_text=_(
            "How long this host takes from an approved order to a handed-over container (image, container, "
            "pre-flight). A window that starts as soon as ready is offered on this host no sooner than the first "
            "full hour after this."
        ),
    )
    host_key = models.CharField(
        _("pinned host key"),
        max_length=1000,
        blank=True,
        help_text=_("The host's public key, one OpenSSH line (ssh-keyscan). Required for the SSH driver."),
    )
    is_active = models.BooleanField(_("active"), default=True)
    notes = models.TextField(_("notes"), blank=True)
    # Each lot's container gets this share of the host (podman --cpus / --memory / --shm-size); a share left empty
    # is derived from the host's size split over its lots (provisioning.shares).
    cpus_per_lot = models.DecimalField(
        _("CPUs per lot"),
        max_digits=6,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(MAX_CPUS_PER_LOT))],
        help_text=_(
            "CPUs each lot's container may use, e.g. 16 or 7.5; empty or 0: the host's CPUs split over its lots."
        ),
    )
    memory_per_lot_gib = models.PositiveIntegerField(
        _("memory per lot (GiB)"),
        default=0,
        validators=[MaxValueValidator(MAX_MEMORY_PER_LOT_GIB)],
        help_text=_("Memory each lot's container may use, in GiB; 0: the host's memory split over its lots."),
    )
    shm_size_gib = models.PositiveSmallIntegerField(
        _("shared memory per lot (GiB)"),
        default=8,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_SHM_GIB)],
        help_text=_("Size of each container's /dev/shm, where PyTorch data loaders pass batches."),
    )
    # What every tenant of the host draws from (provisioning/shares.py): 0 splits the host's own over its lots.
    connections_per_lot = models.PositiveIntegerField(
        _("tracked connections per lot"),
        default=0,
        validators=[MaxValueValidator(MAX_CONNECTIONS_PER_LOT)],
        help_text=_(
            "Connections each lot's container may hold in the kernel's connection-tracking table; 0: the host's "
            "table (nf_conntrack_max) split over its lots."
        ),
    )
    ptys_per_lot = models.PositiveIntegerField(
        _("terminals per lot"),
        default=0,
        validators=[MaxValueValidator(MAX_PTYS_PER_LOT)],
        help_text=_("Terminals (ptys) each lot's container may hold; 0: the host's pool split over its lots."),
    )
    disk_mbps_per_lot = models.PositiveIntegerField(
        _("disk bandwidth per lot (MB/s)"),
        default=0,
        validators=[MaxValueValidator(MAX_DISK_MBPS_PER_LOT)],
        help_text=_(
            "Reads and writes each lot's container may make on the data volumes' disk, per second; 0: no limit, a "
            "weight by lots where the host's kernel honours one (the host check says whether it does)."
        ),
    )
    # What the last "check host" found (provisioning/hosts.py). offers_lots is computed by the database from
    # the mode: booking filters its lots on it (and on exclusive_lot) without knowing what the modes are.
    isolation_mode = models.CharField(
        _("isolation"), max_length=20, choices=Isolation.choices, default=Isolation.UNCHECKED
    )
    isolation_checked_at = models.DateTimeField(_("isolation checked at"), null=True, blank=True)
    isolation_report = models.TextField(_("isolation check report"), blank=True)
    exclusive_lot = models.ForeignKey(
        "Lot",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("exclusive lot"),
        help_text=_("In the exclusive mode, the host's one lot: no other lot of the host is offered."),
    )

    # "Check host" runs on the provisioning queue (the worker holds the SSH key, the web process does not): where
    # the operator's request stands, shown on the console's host page while it runs.
    class CheckState(models.TextChoices):
        IDLE = "", _("no check asked")
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        DONE = "done", _("done")
        FAILED = "failed", _("failed")

    check_state = models.CharField(
        _("check"), max_length=8, choices=CheckState.choices, default=CheckState.IDLE, blank=True, editable=False
    )
    check_requested_at = models.DateTimeField(_("check asked at"), null=True, blank=True, editable=False)
    check_error = models.TextField(_("why the last check failed"), blank=True, editable=False)
    # What the last health check found while the host had running windows (provisioning/health.py): SSH reachable,
    # the lots' GPUs present, disk space. Operators are alerted when it turns to failing, once per failure.
    health_status = models.CharField(
        _("health"), max_length=16, choices=HealthStatus.choices, default=HealthStatus.UNKNOWN
    )
    health_checked_at = models.DateTimeField(_("health checked at"), null=True, blank=True)
    health_report = models.TextField(_("health check report"), blank=True)
    offers_lots = models.GeneratedField(
        expression=models.Case(
            models.When(isolation_mode__in=OFFERING_MODES, then=models.Value(True)),
            models.When(
                models.Q(isolation_mode=Isolation.UNCHECKED)
                & (~models.Q(container_runtime="") | models.Q(driver="dry_run")),
                then=models.Value(True),
            ),
            default=models.Value(False),
        ),
        output_field=models.BooleanField(),
        db_persist=True,
        verbose_name=_("offers lots"),
    )

    class Meta:
        ordering = ["name"]
        verbose_name = _("host")
        verbose_name_plural = _("hosts")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(cpus_per_lot__isnull=True)
                | models.Q(cpus_per_lot__gte=0, cpus_per_lot__lte=MAX_CPUS_PER_LOT),
                name="host_cpus_per_lot_in_range",
            ),
            models.CheckConstraint(
                condition=models.Q(memory_per_lot_gib__lte=MAX_MEMORY_PER_LOT_GIB), name="host_memory_per_lot_in_range"
            ),
            models.CheckConstraint(
                condition=models.Q(shm_size_gib__gte=1, shm_size_gib__lte=MAX_SHM_GIB), name="host_shm_size_in_range"
            ),
            models.CheckConstraint(
                condition=models.Q(
                    connections_per_lot__lte=MAX_CONNECTIONS_PER_LOT,
                    ptys_per_lot__lte=MAX_PTYS_PER_LOT,
                    disk_mbps_per_lot__lte=MAX_DISK_MBPS_PER_LOT,
                ),
                name="host_shared_tables_in_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        # /dev/shm is memory the container's cgroup pays for: a share smaller than it is a container that dies
        # when its data loaders fill it.
        if self.memory_per_lot_gib and self.shm_size_gib and self.shm_size_gib > self.memory_per_lot_gib:
            raise ValidationError(
                {
                    "shm_size_gib": _("Shared memory cannot be larger than the memory share of a lot (%(memory)s GiB).")
                    % {"memory": self.memory_per_lot_gib}
                }
            )


class Lot(models.Model):
    """The unit rented: the cards of one class that go together, on one host."""

    class Status(models.TextChoices):
        ACTIVE = "active", _("Active")
        MAINTENANCE = "maintenance", _("In maintenance")

    name = models.CharField(_("name"), max_length=80, unique=True)
    hardware_class = models.ForeignKey(
        HardwareClass, on_delete=models.PROTECT, related_name="lots", verbose_name=_("hardware class")
    )
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="lots", verbose_name=_("host"))
    gpu_indices = models.CharField(
        _("GPU indices"), max_length=64, help_text=_("The host's GPU indices in this lot, e.g. 0,1.")
    )
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.ACTIVE)

    class Meta:
        ordering = ["hardware_class", "name"]
        verbose_name = _("lot")
        verbose_name_plural = _("lots")
        constraints = [models.UniqueConstraint(fields=["host", "gpu_indices"], name="one_lot_per_host_gpus")]
        indexes = [models.Index(fields=["hardware_class", "status"])]

    def __str__(self) -> str:
        return self.name

    @property
    def gpu_index_list(self) -> list[int]:
        return [int(index) for index in self.gpu_indices.split(",") if index.strip()]

    def clean(self) -> None:
        if not re.fullmatch(r"\d{1,3}(,\d{1,3})*", self.gpu_indices.replace(" ", "")):
            raise ValidationError({"gpu_indices": _("List GPU indices as numbers separated by commas, e.g. 0,1.")})
        self.gpu_indices = self.gpu_indices.replace(" ", "")
        indices = self.gpu_index_list
        if len(set(indices)) != len(indices):
            raise ValidationError({"gpu_indices": _("A GPU index appears twice.")})
        if self.hardware_class_id and len(indices) != self.hardware_class.cards_per_lot:
            raise ValidationError(
                {
                    "gpu_indices": _("A lot of %(hardware)s has %(count)d cards.")
                    % {"hardware": self.hardware_class, "count": self.hardware_class.cards_per_lot}
                }
            )
        if self.host_id:
            taken = {
                index
                for other in Lot.objects.filter(host_id=self.host_id).exclude(pk=self.pk)
                for index in other.gpu_index_list
            }
            if taken & set(indices):
                raise ValidationError({"gpu_indices": _("These GPUs already belong to another lot of this host.")})


class MaintenanceWindow(models.Model):
    """Dates when a host's lots are not sold: a booking whose held period overlaps one is not offered them. Orders
    already placed on them are listed on the console for an operator to move (provisioning.selectors)."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="maintenance_windows", verbose_name=_("host"))
    starts_at = models.DateTimeField(_("starts at (UTC)"))
    ends_at = models.DateTimeField(_("ends at (UTC)"))
    reason = models.CharField(_("reason"), max_length=200)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        ordering = ["starts_at", "pk"]
        verbose_name = _("maintenance window")
        verbose_name_plural = _("maintenance windows")
        constraints = [
            models.CheckConstraint(condition=Q(starts_at__lt=F("ends_at")), name="maintenance_starts_before_end")
        ]
        indexes = [models.Index(fields=["host", "ends_at"])]

    def __str__(self) -> str:
        return f"{self.host} · {self.starts_at:%Y-%m-%d %H:%M} → {self.ends_at:%Y-%m-%d %H:%M}"

    def clean(self) -> None:
        if self.starts_at and self.ends_at and self.starts_at >= self.ends_at:
            raise ValidationError({"ends_at": _("A maintenance window ends after it starts.")})
