from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _


class Host(models.Model):
    """A GPU node of the fleet, reached by a provisioning driver. Lots (booking) live on hosts."""

    class Driver(models.TextChoices):
        DRY_RUN = "dry_run", _("Dry run (demo: records what it would do)")
        SSH = "ssh", _("SSH")

    name = models.SlugField(_("name"), max_length=63, unique=True)
    address = models.CharField(_("address"), max_length=255, help_text=_("Hostname or IP address for SSH."))
    ssh_port = models.PositiveIntegerField(
        _("SSH port"), default=22, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    driver = models.CharField(_("driver"), max_length=16, choices=Driver.choices, default=Driver.DRY_RUN)
    is_active = models.BooleanField(_("active"), default=True)
    notes = models.TextField(_("notes"), blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("host")
        verbose_name_plural = _("hosts")

    def __str__(self) -> str:
        return self.name
