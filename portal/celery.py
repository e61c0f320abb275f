"""The Celery application: configuration comes from Django settings (CELERY_* names)."""

import logging
import logging.config
import os

from celery import Celery
from celery.signals import setup_logging

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
