from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Portal"

    def ready(self) -> None:
        from django.core.checks import register

        from portal.checks import redis_roles_apart

        register(redis_roles_apart, "portal", deploy=True)
