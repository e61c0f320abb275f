"""Deployment checks of the portal's own settings (`manage.py check --deploy`)."""

from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Warning


def redis_roles_apart(app_configs=None, **kwargs) -> list[Warning]:
    """The cache must evict under a memory limit and the broker must never drop a task: an eviction policy is per
    Redis server, so the two need servers of their own (docs/operations.md, "Redis")."""
    if not settings.REDIS_URL or not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        return []
    cache, broker = urlsplit(settings.REDIS_URL), urlsplit(settings.CELERY_BROKER_URL)
    if (cache.hostname, cache.port or 6379) != (broker.hostname, broker.port or 6379):
        return []
    return [
        Warning(
            "The cache (REDIS_URL) and the Celery broker (CELERY_BROKER_URL) use one Redis server.",
            hint="An eviction policy for the cache would drop queued tasks, and without one anyone can fill the "
            "broker's memory through the cache. Give CELERY_BROKER_URL a Redis server of its own "
            "(docker-compose.yml runs `cache` and `broker`).",
            id="portal.W001",
        )
    ]
