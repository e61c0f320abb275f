"""The Celery application: configuration comes from Django settings (CELERY_* names)."""

import logging
import logging.config
import os

from celery import Celery
from celery.signals import setup_logging, task_postrun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def _log_through_the_settings(loglevel=None, **_kwargs) -> None:
    """Worker and beat use settings.LOGGING, whose handlers redact order tokens, instead of replacing the root
    logger's handlers with Celery's own (which would log a task's traceback with a customer's link in it as is).
    The level is the command line's (`--loglevel`, from LOG_LEVEL in bin/worker and bin/beat)."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)


# The periodic tasks whose last run /healthz reports (portal/health.py): the chain scan and the lifecycle sweep.
WATCHED_TASKS = ("payments.scan_chains", "provisioning.lifecycle_tick")


@task_postrun.connect
def _record_a_watched_run(task=None, **_kwargs) -> None:
    """A worker finished one of WATCHED_TASKS: its time, for /healthz. Never in-process (eager) runs."""
    if task is None or task.name not in WATCHED_TASKS or task.request.is_eager:
        return
    from django.db import DatabaseError
    from django.utils import timezone

    from portal.models import ScheduledRun

    try:
        ScheduledRun.objects.update_or_create(task=task.name, defaults={"finished_at": timezone.now()})
    except DatabaseError as exc:  # the database is down: /healthz says so on its own
        logging.getLogger(__name__).warning("the run of %s was not recorded: %s", task.name, type(exc).__name__)
