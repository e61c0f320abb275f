"""Declare the Celery queues on the broker once, before the worker and beat start (`make run` does it).

kombu's SQLAlchemy transport (the embedded default's broker) creates a queue's row the first time a process uses
it, without a lock: a worker and beat starting together both insert "default", and the loser stops on a UNIQUE
constraint. Declared here first, by one process, they already exist when the others start. With Redis, declaring
a queue does nothing and this is harmless.
"""

from django.conf import settings
from django.core.management.base import BaseCommand
from kombu import Queue

from portal.celery import app


def queue_names() -> list[str]:
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values() if "queue" in route}
    return sorted({settings.CELERY_TASK_DEFAULT_QUEUE, *routed})


class Command(BaseCommand):
    help = "Declare the Celery queues on the broker (before starting the worker and beat together)."

    def handle(self, *args, **options) -> None:
        names = queue_names()
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            for name in names:
                Queue(name, routing_key=name)(channel).declare()
        self.stdout.write(f"queues declared: {', '.join(names)}")
