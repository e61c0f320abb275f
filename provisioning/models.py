from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from portal.singleton import SingletonRow
from provisioning.containers import RUNTIME_PATTERN

MAX_CPUS_PER_LOT = 1024
MAX_MEMORY_PER_LOT_GIB = 16384  # 16 TiB: more than any host of the fleet, less than what overflows podman
MAX_SHM_GIB = 1024


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


class Host(models.Model):
    """A GPU node of the fleet, reached by a provisioning driver. Lots (booking) live on hosts."""

    Isolation = Isolation

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
    host_key = models.CharField(
        _("pinned host key"),
        max_length=1000,
        blank=True,
        help_text=_("The host's public key, one OpenSSH line (ssh-keyscan). Required for the SSH driver."),
    )
    is_active = models.BooleanField(_("active"), default=True)
    notes = models.TextField(_("notes"), blank=True)
    # Each lot's container gets this share of the host (podman --cpus / --memory / --shm-size); a share left empty
    # is derived from the host's size split over its lots (provisioning.steps._shares).
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
    # What the last "check host" found (provisioning/host_checks.py). offers_lots is computed by the database from
    # the mode: booking filters its lots on it (and on exclusive_lot) without knowing what the modes are.
    isolation_mode = models.CharField(
        _("isolation"), max_length=20, choices=Isolation.choices, default=Isolation.UNCHECKED
    )
    isolation_checked_at = models.DateTimeField(_("isolation checked at"), null=True, blank=True)
    isolation_report = models.TextField(_("isolation check report"), blank=True)
    exclusive_lot = models.ForeignKey(
        "booking.Lot",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("exclusive lot"),
        help_text=_("In the exclusive mode, the host's one lot: no other lot of the host is offered."),
    )
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


class OperatorSettings(SingletonRow, models.Model):
    """Operator-set rules of provisioning. One row (pk=1), edited in the admin."""

    auto_approve = models.BooleanField(
        _("approve paid orders automatically"), default=False, help_text=_("Off: an operator approves each order.")
    )
    provision_lead_hours = models.PositiveSmallIntegerField(_("provision this many hours before the window"), default=6)
    key_grace_minutes = models.PositiveIntegerField(
        _("keys stay valid this many minutes after the window"),
        default=60,
        help_text=_("Written into each key's expiry-time: sshd refuses the key after it, even if teardown failed."),
    )
    wipe_after_days = models.PositiveSmallIntegerField(
        _("delete the customer's files this many days after the window"),
        default=7,
        help_text=_("Announced in the end-of-window e-mails. Until then the account is locked and its files kept."),
    )

    class Meta:
        verbose_name = _("operator settings")
        verbose_name_plural = _("operator settings")
        constraints = [models.CheckConstraint(condition=models.Q(pk=1), name="operator_settings_single_row")]

    def __str__(self) -> str:
        return str(_("Operator settings"))


class ProvisioningRun(models.Model):
    """One attempt at provisioning, re-checking or tearing down an order's access: a list of recorded steps."""

    class Kind(models.TextChoices):
        PROVISION = "provision", _("Provision")
        PREFLIGHT = "preflight", _("Re-run the pre-flight check")
        KEYS = "keys", _("Hand over: write the keys")
        WIPE = "wipe", _("Delete the customer's files")
        TEARDOWN = "teardown", _("Teardown")
        # The teardown of the hosts an order left (a lot reassigned to another host): the order goes on elsewhere.
        RELEASE_HOST = "release_host", _("Tear down a host the order left")

    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Running")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")

    order = models.ForeignKey("booking.Order", on_delete=models.PROTECT, related_name="provisioning_runs")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # A worker holds the run while lease_until is in the future; a killed worker's lease runs out and the
    # lifecycle sweep hands the run to another worker, which resumes at the first step not done.
    lease_until = models.DateTimeField(null=True, blank=True)
    triggered_by = models.ForeignKey("auth.User", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # How many times the run was executed to an end, a success or a failure. A failed run that takes access away
    # (teardown, wipe, release of a host) is queued again by the lifecycle sweep at next_retry_at, with a delay
    # that doubles at each failure (provisioning.services.retry_delay): the same run resumes at its failed step.
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_retry_at = models.DateTimeField(_("next retry at"), null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The sweep's "failed runs due for a retry": few rows among many runs.
            models.Index(
                fields=["next_retry_at"], condition=models.Q(status="failed"), name="provisioningrun_retry_due"
            ),
        ]
        verbose_name = _("provisioning run")
        verbose_name_plural = _("provisioning runs")

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.order_id} ({self.status})"

    @property
    def duration_s(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


# Runs that take access away: one that fails is queued again by the lifecycle sweep, after a delay that doubles at
# each failure (provisioning.services.retry_delay), until it succeeds; the console lists those failing.
RETRIED_RUN_KINDS = (ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.WIPE, ProvisioningRun.Kind.RELEASE_HOST)


class ProvisioningStep(models.Model):
    """One idempotent step of a run on one host: started, finished, output, error. Done steps are never redone."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        RUNNING = "running", _("Running")
        DONE = "done", _("Done")
        FAILED = "failed", _("Failed")

    run = models.ForeignKey(ProvisioningRun, on_delete=models.CASCADE, related_name="steps")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="+")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=40)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    output = models.TextField(blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["run", "position"], name="one_step_per_position")]

    def __str__(self) -> str:
        return f"{self.name}@{self.host_id} ({self.status})"

    @property
    def duration_s(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class Access(models.Model):
    """The customer's login on one host of the order, with the GPUs it may use."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Being prepared")
        READY = "ready", _("Ready")
        REVOKED = "revoked", _("Revoked")

    order = models.ForeignKey("booking.Order", on_delete=models.PROTECT, related_name="accesses")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="accesses")
    username = models.CharField(max_length=32)
    gpu_indices = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    ready_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    preflight_report = models.JSONField(null=True, blank=True)
    preflight_status = models.CharField(max_length=8, blank=True)
    keys_expire_at = models.DateTimeField(null=True, blank=True)  # the expiry-time written with the keys
    wiped_at = models.DateTimeField(null=True, blank=True)  # the account and its files deleted from the host
    # Why an operator handed the machines over although the pre-flight check failed: the customer reads it
    # beside the report.
    handover_note = models.TextField(blank=True)
    # What provisioning made (provisioning.steps): the customer's SSH server in the container, its host key (the
    # order page gives the known_hosts line), the image pinned by ID, the data volume's size and the shares.
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    ssh_host_key = models.CharField(max_length=200, blank=True)
    image_id = models.CharField(max_length=64, blank=True)
    disk_gib = models.PositiveIntegerField(null=True, blank=True)
    shares = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["host__name"]
        verbose_name = _("access")
        verbose_name_plural = _("accesses")
        constraints = [models.UniqueConstraint(fields=["order", "host"], name="one_access_per_order_host")]

    def __str__(self) -> str:
        return f"{self.username}@{self.host}"

    @property
    def ssh_command(self) -> str:
        """How the customer logs in: to the SSH server of their container, on its published port."""
        port = f" -p {self.ssh_port}" if self.ssh_port and self.ssh_port != 22 else ""
        return f"ssh{port} {self.username}@{self.host.address}"

    @property
    def known_hosts_line(self) -> str:
        """The container's host key as a known_hosts line: the customer pins it instead of trusting the first use."""
        if not self.ssh_host_key:
            return ""
        where = self.host.address if self.ssh_port in (None, 22) else f"[{self.host.address}]:{self.ssh_port}"
        return f"{where} {self.ssh_host_key}"


class LifecycleNotice(models.Model):
    """A warning sent before the window ends (48 h, 24 h, 1 h): once each per window end, so that an extended
    window is warned again before its new end."""

    order = models.ForeignKey("booking.Order", on_delete=models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=8)
    window_end = models.DateTimeField()
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order", "kind", "window_end"], name="one_notice_per_kind_and_end")
        ]

    def __str__(self) -> str:
        return f"{self.order_id} {self.kind}"
