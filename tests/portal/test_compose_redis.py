"""docker-compose.yml's two Redis servers, run from their own command lines with Debian's redis-server: the cache
and the broker each ask for the password, the cache evicts under its memory limit, the broker never does, and the
portal's URLs name each with the password.

The whole stack is not brought up here (no registry is reachable for the redis:7 image): the command lines and
health checks of the compose file are run as they are, on a free port."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

from tests.payments.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PASSWORD = "a-test-password-0f9c2e"  # what an operator puts in REDIS_PASSWORD (URL-safe, docs/operations.md)


def _interpolated(text: str, environment: dict[str, str]) -> str:
    """What compose does to a value: ${NAME:?message} and ${NAME:-default} from `environment`, $$ to $."""

    def variable(match: re.Match) -> str:
        name, operator, rest = match["name"], match["operator"], match["rest"]
        if environment.get(name):
            return environment[name]
        if operator == ":?":
            raise KeyError(f"{name} is required: {rest}")
        return rest or ""

    text = re.sub(r"(?<!\$)\$\{(?P<name>[A-Z_]+)(?:(?P<operator>:[?-])(?P<rest>[^}]*))?\}", variable, text)
    return text.replace("$$", "$")


def _shell(service: str) -> str:
    command = COMPOSE["services"][service]["command"]
    assert command[:2] == ["sh", "-c"], command
    return _interpolated(command[2], {"REDIS_PASSWORD": PASSWORD})


class ComposeRedis:
    """One Redis service of the compose file, started from its command line on a free loopback port."""

    def __init__(self, service: str, tmp_path: Path, **environment: str) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is missing: make system-deps installs Debian's redis-server", pytrace=False)
        self.service = service
        self.port = free_port()
        self.environment = {**os.environ, "REDIS_PASSWORD": PASSWORD, **environment}
        script = f"{_shell(service)} --port {self.port} --bind 127.0.0.1 --dir {tmp_path}"
        self.process = subprocess.Popen(
            ["sh", "-c", script], env=self.environment, stdout=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, password=PASSWORD).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, f"{service}: redis-server did not start"
                time.sleep(0.05)

    def healthcheck_passes(self, **environment: str) -> bool:
        test = COMPOSE["services"][self.service]["healthcheck"]["test"]
        assert test[0] == "CMD-SHELL", test
        script = _interpolated(test[1], {}).replace("redis-cli", f"redis-cli -p {self.port}")
        return subprocess.run(["sh", "-c", script], env={**self.environment, **environment}).returncode == 0

    def url(self, variable: str) -> str:
        """The portal's URL for this server (REDIS_URL or CELERY_BROKER_URL of the compose file), on its port."""
        value = _interpolated(COMPOSE["x-environment"][variable], {"REDIS_PASSWORD": PASSWORD})
        return value.replace(f"@{self.service}:6379/", f"@127.0.0.1:{self.port}/")

    def stop(self) -> None:
        os.killpg(self.process.pid, 15)
        self.process.wait(timeout=10)


@pytest.fixture
def compose_redis(tmp_path):
    started = []

    def start(service: str, **environment: str) -> ComposeRedis:
        folder = tmp_path / service
        folder.mkdir()
        started.append(ComposeRedis(service, folder, **environment))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def test_the_cache_and_the_broker_are_two_servers_each_named_with_the_password():
    cache_url = _interpolated(COMPOSE["x-environment"]["REDIS_URL"], {"REDIS_PASSWORD": PASSWORD})
    broker_url = _interpolated(COMPOSE["x-environment"]["CELERY_BROKER_URL"], {"REDIS_PASSWORD": PASSWORD})
    assert cache_url == f"redis://:{PASSWORD}@cache:6379/0"
    assert broker_url == f"redis://:{PASSWORD}@broker:6379/0"
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):  # compose refuses to start without one
        _interpolated(COMPOSE["x-environment"]["REDIS_URL"], {})


@pytest.mark.parametrize("service", ["cache", "broker"])
def test_a_client_without_the_password_is_refused(compose_redis, service):
    server = compose_redis(service)

    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=server.port).set("queue", "stolen")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=server.port, password="guessed").ping()
    assert not server.healthcheck_passes(REDIS_PASSWORD="guessed")
    assert server.healthcheck_passes()
    variable = "REDIS_URL" if service == "cache" else "CELERY_BROKER_URL"
    assert redis.Redis.from_url(server.url(variable)).ping()


def test_the_cache_evicts_its_least_recently_used_keys_at_its_memory_limit(compose_redis):
    server = compose_redis("cache", REDIS_CACHE_MAXMEMORY="4mb")
    client = redis.Redis.from_url(server.url("REDIS_URL"))
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
    assert client.config_get("maxmemory") == {"maxmemory": str(4 * 1024 * 1024)}

    # anyone can make the portal write cache entries (one per booking page query): writes go on, old ones go
    for index in range(40):
        client.set(f"binome:3:booking:page:en:{index}", "x" * 256 * 1024)
    assert client.dbsize() < 40
    assert client.get("binome:3:booking:page:en:39") is not None


def test_the_broker_refuses_a_write_rather_than_drop_a_queued_task(compose_redis):
    server = compose_redis("broker")
    client = redis.Redis.from_url(server.url("CELERY_BROKER_URL"))
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert client.config_get("appendonly") == {"appendonly": "yes"}
