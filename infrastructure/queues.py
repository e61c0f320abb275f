"""Tasks looked up by name: each app's `enqueue` module queues its tasks through `task()`, so that the services that
queue work never import the tasks that call them (each app registers its tasks when ready, in its apps.py)."""

from celery import current_app


def task(name: str):
    """The registered task called `name` (its @shared_task name)."""
    return current_app.tasks[name]
