"""System checks of what production must not carry in its database: the demo operator of `make run`, whose
password is public (provisioning/demo.py). bin/web runs them (`check --database default`) before serving."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.checks import Error, Tags, register
from django.db import DatabaseError


@register(Tags.database)
def demo_operator_refused(app_configs=None, databases=None, **kwargs) -> list[Error]:
    from provisioning.demo import DEMO_OPERATOR_PASSWORD, DEMO_OPERATOR_USERNAME

    if not settings.REFUSE_DEMO_PIECES or not databases:
        return []
    try:
        demo = get_user_model().objects.filter(username=DEMO_OPERATOR_USERNAME, is_active=True).first()
    except DatabaseError:  # not migrated yet: nothing to refuse
        return []
    if demo is None or not demo.check_password(DEMO_OPERATOR_PASSWORD):
        return []
    return [
        Error(
            f"The demo operator '{DEMO_OPERATOR_USERNAME}' exists with its public password.",
            hint="Delete it, or set it a password of its own, before serving (docs/operations.md).",
            id="provisioning.E001",
        )
    ]
