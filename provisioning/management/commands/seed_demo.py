from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from provisioning.demo import DEMO_OPERATOR_PASSWORD, DEMO_OPERATOR_USERNAME, seed_demo_catalog, seed_demo_operator


class Command(BaseCommand):
    help = "Seed the demo catalog, dry-run hosts, lots and a demo operator account (development only)."

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("seed_demo creates a known operator password: it runs only with DEBUG on.")
        counts = seed_demo_catalog()
        seed_demo_operator()
        self.stdout.write(f"Demo catalog: {counts['classes']} hardware classes, {counts['lots']} lots (dry-run hosts).")
        self.stdout.write(
            f"Demo operator (demo only): user {DEMO_OPERATOR_USERNAME!r}, password {DEMO_OPERATOR_PASSWORD!r}"
        )
