"""The production stack, built and started here from its own files (issue 19): the images docker-compose.yml runs,
built from Debian packages (bin/stack-images; no registry is reachable), the app's image from the Dockerfile with
secrets planted in its build context, and the compose file's services brought up by podman-compose with the
variables a deployer gives: PostgreSQL and the two Redis servers pass their own healthchecks with their passwords,
the app's processes accept the production settings with the secrets mounted as the file says, only the worker is
given the SSH key, and the image holds none of the planted secrets.

On this sandbox's bridges no packet passes between two containers (its kernel passes none between two containers
of one bridge, none from a container to the host, and aardvark-dns, podman's name server, never answers), so here
the services run on their compose networks apart, and tests/portal/test_compose_stack_host.py runs them as one on
the host's network: a booking through nginx, the worker's e-mail, beat's schedule. podman 4.3 also ignores
`condition: service_healthy` and runs healthchecks from systemd timers, which this sandbox lacks: the tests run
each service's own healthcheck (`podman healthcheck run`) until it passes.
The build sees the host's certificate store (this network's TLS proxy signs PyPI's certificates), and podman's file
limit is lowered for every container (runc cannot raise it here): both are this machine's, not the stack's.
"""

import json
import subprocess

import pytest

from tests.builders.compose import APP_IMAGE, PLANTED, Stack, example_settings, prepared_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    directory = tmp_path_factory.mktemp("stack")
    # the operator's deploy/production.env: the example with every optional setting written out as it stands
    with prepared_stack(Stack(directory), directory, settings=example_settings()) as stack:
        stack.compose("up", "-d", "--no-deps", "db", "broker", "cache")
        for service in ("db", "broker", "cache"):
            stack.healthy(service)
        yield stack


def _in(stack: Stack, service: str, *argv: str) -> subprocess.CompletedProcess:
    return stack.run("podman", "exec", stack.container(service), *argv, check=False)


def test_postgres_and_both_redis_servers_start_healthy_and_refuse_a_client_without_the_password(stack):
    password = stack.settings["POSTGRES_PASSWORD"]
    select = ["psql", "-h", "127.0.0.1", "-U", "binome", "-d", "binome", "-tAc", "select current_user"]
    assert _in(stack, "db", "env", f"PGPASSWORD={password}", *select).stdout.strip() == "binome"
    assert _in(stack, "db", "env", "PGPASSWORD=wrong", *select).returncode != 0
    for service in ("broker", "cache"):
        assert "NOAUTH" in _in(stack, service, "redis-cli", "ping").stdout
    auth = ["env", f"REDISCLI_AUTH={stack.settings['REDIS_PASSWORD']}", "redis-cli", "config", "get"]
    broker = _in(stack, "broker", *auth, "*").stdout.split()
    cache = _in(stack, "cache", *auth, "*").stdout.split()
    setting = lambda listed, name: listed[listed.index(name) + 1]  # noqa: E731
    # the broker keeps queued tasks (on disk, never evicted); the cache is bounded and evicts, nothing on disk
    assert (setting(broker, "appendonly"), setting(broker, "maxmemory-policy")) == ("yes", "noeviction")
    assert (setting(cache, "appendonly"), setting(cache, "maxmemory-policy")) == ("no", "allkeys-lru")
    assert setting(cache, "maxmemory") == str(256 * 2**20)


def test_a_container_s_log_is_cut_at_the_operator_s_size_however_much_it_writes(stack):
    # the example's LOG_MAX_SIZE=20m, on every service
    for service in ("db", "broker", "cache"):
        config = json.loads(
            stack.run(
                "podman", "inspect", "--format", "{{json .HostConfig.LogConfig}}", stack.container(service)
            ).stdout
        )
        assert (config["Type"], config["Size"]) == ("json-file", "20MB"), service
    # when: the cache server's output grows by 30 MB (as a year of warnings would)
    flood = "head -c 30000000 /dev/zero | tr '\\0' x | fold -w 99 > /proc/1/fd/1"
    assert _in(stack, "cache", "sh", "-c", flood).returncode == 0
    # then: its log file stays within the limit
    size = stack.run("stat", "-c", "%s", config["Path"]).stdout.strip()
    assert 0 < int(size) <= 20 * 10**6, size


def test_every_setting_of_the_operator_s_file_reaches_the_app_s_services(stack):
    assert set(example_settings()) < set(stack.settings)  # every optional setting of the example, and the required
    for service in ("migrate", "web", "worker", "beat"):
        printed = stack.compose("run", "--rm", "-T", "--no-deps", service, "env").stdout
        received = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
        passwords = {
            name: received.get(name) for name in ("POSTGRES_PASSWORD", "POSTGRES_APP_PASSWORD", "REDIS_PASSWORD")
        }
        assert passwords == dict.fromkeys(passwords, ""), service  # inside their URLs only: the app's own role's
        assert stack.settings["POSTGRES_PASSWORD"] not in received.get("DATABASE_URL", "") or service == "migrate"
        lost = {
            name: (value, received.get(name))
            for name, value in stack.settings.items()
            if received.get(name) != value and name not in passwords
        }
        assert not lost, (service, lost)
    assert received["ADMINS"] == "ops@your-lab.org" and received["LOG_LEVEL"] == "INFO"  # what the issue found lost


def test_the_app_accepts_the_production_settings_and_only_the_worker_is_given_the_ssh_key(stack):
    def run(service: str, command: str) -> subprocess.CompletedProcess:
        return stack.compose("run", "--rm", "-T", "--no-deps", service, "sh", "-c", command, check=False)

    checked = run("web", "python manage.py check --deploy --fail-level ERROR")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert run("worker", "test -r /run/secrets/provisioning_ssh_key && test -r /run/secrets/chains").returncode == 0
    assert run("web", "test -e /run/secrets/provisioning_ssh_key").returncode != 0
    assert run("beat", "test -e /run/secrets/provisioning_ssh_key").returncode != 0
    assert run("web", "ls /run/secrets").stdout.split() == ["chains"]


def test_the_image_holds_no_secret_of_its_build_context(stack):
    found = stack.run(
        "podman", "run", "--rm", APP_IMAGE, "sh", "-c",
        f"ls -A /app; grep -rl {PLANTED} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null; true",
    ).stdout.split()  # fmt: skip
    assert PLANTED not in " ".join(found) and not [path for path in found if path.startswith("/")], found
    assert {".env", "secrets", "deploy", ".git", "tests", "node_modules"}.isdisjoint(found)
    assert {"manage.py", "portal", "staticfiles", "templates"} <= set(found)
