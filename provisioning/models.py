from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from infrastructure.singleton import SingletonRow
from inventory.models import Host


class OperatorSettings(SingletonRow, models.Model):
    """Operator-set rules of provisioning. One row (pk=1), edited in the admin."""

    auto_approve = models.BooleanField(
        _("approve paid orders automatically"), default=False, help_text=_("Off: an operator approves each order.")
    )
    approval_response_hours = models.PositiveSmallIntegerField(
        _("approve paid orders within this many hours"),
        default=24,
        validators=[MinValueValidator(1), MaxValueValidator(720)],
        help_text=_(
            "When approval is not automatic: said to researchers on the order page and in the payment e-mail, and "
            "the console marks the paid orders waiting longer."
        ),
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
    imbalance_minutes = models.PositiveSmallIntegerField(
        _("say an unbalanced split after this many minutes"),
        default=30,
        validators=[MinValueValidator(5), MaxValueValidator(24 * 60)],
        help_text=_(
            "One card nearly idle while another is busy, every minute for this long: the order page says it and "
            "the researcher is e-mailed, as often as they allow (provisioning/watch.py)."
        ),
    )
    idle_hours = models.PositiveSmallIntegerField(
        _("say idle cards after this many hours"),
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(72)],
        help_text=_("Every card of a running window nearly idle for this long: said the same way."),
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
        # A provider fault: the order's new lots prepared and handed over in one run, during its window; the hosts it
        # left are released once it succeeds.
        MOVE = "move", _("Move to other lots")
        # After the end: the download window's keys rewritten (a key removed or added while the files are kept).
        DOWNLOAD_KEYS = "download_keys", _("Rewrite the download window's keys")
        # During the window, the container found stopped by the watch (provisioning/restarts.py), or an operator's
        # decision after the watch held it: started again and its sshd answering.
        RESTART = "restart", _("Start the stopped container again")

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
    # that doubles at each failure (provisioning.rules.retry_delay): the same run resumes at its failed step.
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_retry_at = models.DateTimeField(_("next retry at"), null=True, blank=True)
    # A failed run that is not retried any more: an operator decided (stop retrying a move, with the reason in the
    # order's events), or a later move replaced it. The sweep and the console's failing runs leave it alone.
    given_up_at = models.DateTimeField(_("given up at"), null=True, blank=True)

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


# Runs that take access away, and moves (a failed one holds a lot that no one can book, beside the container the
# customer still works in): one that fails is queued again by the lifecycle sweep, after a delay that doubles at
# each failure (provisioning.rules.retry_delay), until it succeeds or, for a move, an operator gives it up; the
# console lists those failing.
RETRIED_RUN_KINDS = (
    ProvisioningRun.Kind.TEARDOWN,
    ProvisioningRun.Kind.WIPE,
    ProvisioningRun.Kind.RELEASE_HOST,
    ProvisioningRun.Kind.MOVE,
)


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
    # The read-only download window after the end (provisioning.container_steps.open_download): the port of its
    # SFTP-only server, and when its keys expire (the wipe's date).
    download_port = models.PositiveIntegerField(null=True, blank=True)
    download_until = models.DateTimeField(null=True, blank=True)
    # The container's restarts by the watch during the window (provisioning/restarts.py): how many since it last ran
    # long enough, the last one, and when the watch stopped restarting it (a loop) until an operator decides.
    restarts = models.PositiveSmallIntegerField(default=0)
    restarted_at = models.DateTimeField(null=True, blank=True)
    restarts_held_at = models.DateTimeField(null=True, blank=True)
    # The checkpoint watch (provisioning/watch.py): when it last read the order's checkpoint directory in this
    # container, the newest file's time it found there (None: none), what the reading said ("ok", "none",
    # "not a directory", "unreadable") and of which directory (one the researcher changed since is read again).
    checkpoint_checked_at = models.DateTimeField(null=True, blank=True)
    checkpoint_newest_at = models.DateTimeField(null=True, blank=True)
    checkpoint_read = models.CharField(max_length=16, blank=True)
    checkpoint_dir_read = models.CharField(max_length=200, blank=True)  # the directory that reading was of

    class Meta:
        ordering = ["host__name"]
        verbose_name = _("access")
        verbose_name_plural = _("accesses")
        constraints = [models.UniqueConstraint(fields=["order", "host"], name="one_access_per_order_host")]

    def __str__(self) -> str:
        return f"{self.username}@{self.host}"

    @property
    def gpu_index_list(self) -> list[int]:
        """The host's indices of the access's GPUs ("0,1" → [0, 1])."""
        return [int(part) for part in self.gpu_indices.split(",") if part.strip().isdigit()]

    @property
    def ssh_command(self) -> str:
        """How the customer logs in: to the SSH server of their container, on its published port."""
        port = f" -p {self.ssh_port}" if self.ssh_port and self.ssh_port != 22 else ""
        return f"ssh{port} {self.username}@{self.host.address}"

    @property
    def forward_command(self) -> str:
        """A web server on port 8888 in the container (Jupyter's), reached at http://localhost:8888 on the
        customer's own machine while this runs."""
        return self.ssh_command.replace("ssh", "ssh -N -L 8888:localhost:8888", 1)

    @property
    def sftp_command(self) -> str:
        """How the customer downloads their files after the end, read-only."""
        return f"sftp -P {self.download_port} {self.username}@{self.host.address}" if self.download_port else ""

    @property
    def download_known_hosts_line(self) -> str:
        if not self.ssh_host_key or not self.download_port:
            return ""
        return f"[{self.host.address}]:{self.download_port} {self.ssh_host_key}"

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


class GpuReading(models.Model):
    """One minute of an access's GPUs, as the host's own tool (nvidia-smi, rocm-smi) reported them: per GPU,
    [host index, utilisation %, memory used MiB, memory total MiB, power W] (None where the tool had no figure).
    Only the access's own GPUs are kept: a customer never sees another's cards."""

    access = models.ForeignKey(Access, on_delete=models.CASCADE, related_name="readings")
    taken_at = models.DateTimeField()
    gpus = models.JSONField()

    class Meta:
        ordering = ["taken_at"]
        constraints = [models.UniqueConstraint(fields=["access", "taken_at"], name="one_reading_per_access_minute")]

    def __str__(self) -> str:
        return f"{self.access} at {self.taken_at:%Y-%m-%d %H:%M}"


class WatchAlert(models.Model):
    """What a window's readings showed that its researcher should know while it happens (provisioning/watch.py):
    one card nearly idle while another is busy, or every card idle. One row per stretch: open (`ended_at` null)
    while it lasts, ended when a minute reads otherwise or the window stops running."""

    class Kind(models.TextChoices):
        IMBALANCE = "imbalance", _("one card nearly idle while another is busy")
        IDLE = "idle", _("every card nearly idle")
        CHECKPOINT = "checkpoint", _("no new checkpoint")

    order = models.ForeignKey("booking.Order", on_delete=models.CASCADE, related_name="watch_alerts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    started_at = models.DateTimeField()  # the first minute of the stretch that showed it
    last_seen_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    mailed_at = models.DateTimeField(null=True, blank=True)  # the researcher was e-mailed about this stretch
    idle_cards = models.JSONField(default=list)  # [[host, GPU index], ...] nearly idle in the newest minute
    busy_cards = models.JSONField(default=list)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["order", "kind"], condition=models.Q(ended_at__isnull=True), name="one_open_watch_alert"
            )
        ]

    def __str__(self) -> str:
        return f"{self.order_id} {self.kind} from {self.started_at:%Y-%m-%d %H:%M}"


class ResearchRecord(models.Model):
    """The signed record of a window that ran (provisioning/research_record.py): the JSON exactly as signed, its
    Ed25519 signature, and the PDF whose SHA-256 the JSON names. Deleted with the order's files."""

    order = models.OneToOneField("booking.Order", on_delete=models.CASCADE, related_name="research_record")
    issued_at = models.DateTimeField()
    document = models.BinaryField()
    signature = models.BinaryField()
    pdf = models.BinaryField()
    key_id = models.CharField(max_length=16)  # the signing key's short name (SHA-256 of the public key)

    class Meta:
        verbose_name = _("research record")
        verbose_name_plural = _("research records")

    def __str__(self) -> str:
        return f"{self.order_id} record of {self.issued_at:%Y-%m-%d}"
