"""What the roof keeps of its own: when beat's watched tasks last ran, for /healthz (portal/health.py)."""

from django.db import models


class ScheduledRun(models.Model):
    """The last time a worker finished one of the periodic tasks /healthz watches (recorded in portal/celery.py):
    beat stopped, or no worker taking its tasks, shows as a time that grows old."""

    task = models.CharField(max_length=100, unique=True)
    finished_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.task} at {self.finished_at:%Y-%m-%d %H:%M:%S} UTC"
