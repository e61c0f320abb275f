"""Give the processes that serve and work (web, worker, beat) a PostgreSQL role of their own that may read and write
rows and nothing more, so that nothing they run can alter a table or drop the trigger that keeps issued invoices
unchanged. Run by the owner of the tables (the role `migrate` connects as), right after `migrate`:

    APP_DATABASE_URL=postgres://binome_app:…@db:5432/binome python manage.py grant_app_role

It creates the role named by APP_DATABASE_URL, or brings an existing one back to these rights and that password
(run it again after changing the password); grants rows of every table and sequence of the schema; and makes the
tables later migrations create granted the same way (ALTER DEFAULT PRIVILEGES for the owner). docker-compose.yml's
`migrate` service runs it; the app's services connect as that role.
"""

import re

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from environ import Env
from psycopg import sql

ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class Command(BaseCommand):
    help = "Create or update the app's database role (rows only, no DDL) from APP_DATABASE_URL; run as the owner."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--url", help="the app's database URL (default: the APP_DATABASE_URL setting)")

    def handle(self, *args, url: str | None = None, **options) -> None:
        url = url or settings.APP_DATABASE_URL
        if not url:
            raise CommandError("APP_DATABASE_URL is not set: give the URL the app's processes connect with.")
        if connection.vendor != "postgresql":
            raise CommandError("grant_app_role is for PostgreSQL: the embedded SQLite database has no roles.")
        try:
            config = Env.db_url_config(url)
        except Exception as exc:  # django-environ raises several kinds on a malformed URL
            raise CommandError(f"APP_DATABASE_URL is not a database URL: {type(exc).__name__}") from exc
        role, password = config.get("USER") or "", config.get("PASSWORD") or ""
        if not ROLE_NAME.fullmatch(role) or role.startswith("pg_") or role == "public":
            raise CommandError("APP_DATABASE_URL's user must be a lower-case role name (letters, digits, _).")
        if not password:
            raise CommandError("APP_DATABASE_URL has no password: the app's role logs in with one.")
        if config.get("NAME") != connection.settings_dict["NAME"]:
            raise CommandError("APP_DATABASE_URL names another database than the one migrated here.")
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            (owner,) = cursor.fetchone()
            if role == owner:
                raise CommandError("APP_DATABASE_URL's role is the owner's: the app needs a role of its own.")
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            for statement in self._statements(verb, role, password, owner):
                cursor.execute(statement.as_string(cursor.connection))
        self.stdout.write(
            f"{role}: rows of every table of {connection.settings_dict['NAME']}, no DDL ({verb.lower()}d)"
        )

    @staticmethod
    def _statements(verb: str, role: str, password: str, owner: str) -> list[sql.Composed]:
        names = {"role": sql.Identifier(role), "owner": sql.Identifier(owner), "password": sql.Literal(password)}
        rights = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT"
        return [
            sql.SQL(f"{verb} ROLE {{role}} WITH {rights} PASSWORD {{password}}").format(**names),
            sql.SQL("GRANT CONNECT ON DATABASE {database} TO {role}").format(
                database=sql.Identifier(connection.settings_dict["NAME"]), **names
            ),
            sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}").format(**names),
            sql.SQL("GRANT USAGE ON SCHEMA public TO {role}").format(**names),
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}").format(**names),
            sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}").format(**names),
            # The migrations' record is the owner's: a row deleted or planted there would make the next `migrate`
            # fail (the stack stays down) or skip a migration. The app only reads it (Django's checks).
            sql.SQL("REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON django_migrations FROM {role}").format(**names),
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public "
                "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}"
            ).format(**names),
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public "
                "GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {role}"
            ).format(**names),
        ]
