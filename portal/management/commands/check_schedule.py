"""Exit 1 when beat's watched tasks are late (portal/health.py): the compose file's healthcheck of `beat`."""

from django.core.management.base import BaseCommand, CommandError

from portal.health import check_schedule


class Command(BaseCommand):
    help = "Say whether the chain scan and the lifecycle sweep ran on time; exit 1 when one is late."

    def handle(self, *args, **options) -> None:
        on_time, detail = check_schedule()
        if not on_time:
            raise CommandError(f"late: {detail}")
        self.stdout.write(detail)
