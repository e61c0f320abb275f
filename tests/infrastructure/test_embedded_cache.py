"""The embedded default's cache (infrastructure/embedded_cache.py): a Django cache, shared by processes, whose add
and incr stay exact when several processes use them at once (the web workers, the Celery worker's children, beat)."""

import multiprocessing
import time

import pytest
from django.test import RequestFactory
from django_ratelimit.core import is_ratelimited

from infrastructure.embedded_cache import CULL_EVERY, SQLiteCache

# Forked, like gunicorn's and Celery's workers: a child starts with a copy of its parent's cache object.
FORK = multiprocessing.get_context("fork")
PROCESSES = 4


@pytest.fixture
def cache_file(tmp_path):
    return tmp_path / "cache" / "cache.sqlite3"  # a folder that does not exist yet


def in_processes(target, *args) -> list:
    """Run `target(barrier, index, *args)` in PROCESSES forked processes at once; their return values."""
    barrier = FORK.Barrier(PROCESSES)
    results = FORK.Queue()

    def run(index: int) -> None:
        results.put((index, target(barrier, index, *args)))

    processes = [FORK.Process(target=run, args=(index,)) for index in range(PROCESSES)]
    for process in processes:
        process.start()
    collected = dict(results.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    return [collected[index] for index in range(PROCESSES)]


def test_it_answers_as_a_django_cache(cache_file):
    cache = SQLiteCache(str(cache_file), {"OPTIONS": {"MAX_ENTRIES": 10_000}})
    assert cache.get("missing", "default") == "default"
    cache.set("entry", {"body": "<p>", "versions": ["a", "b"]})
    assert cache.get("entry") == {"body": "<p>", "versions": ["a", "b"]}
    with pytest.raises(TypeError):  # JSON, as the Redis cache of production: no pickle, no bytes
        cache.set("bytes", b"<p>")
    cache.set("flag", True)
    assert cache.get("flag") is True  # not the integer 1

    assert cache.add("counter", 10) is True
    assert cache.add("counter", 99) is False
    assert cache.incr("counter") == 11 and cache.incr("counter", 5) == 16 and cache.decr("counter") == 15
    assert cache.get("counter") == 15
    with pytest.raises(ValueError):
        cache.incr("missing")
    with pytest.raises(TypeError):
        cache.incr("entry")

    cache.set_many({"one": 1, "two": "2"}, timeout=60)
    assert cache.get_many(["one", "two", "missing"]) == {"one": 1, "two": "2"}
    assert cache.get_or_set("generation", lambda: 7, timeout=None) == 7 and cache.get_or_set("generation", 8) == 7
    many = {f"key-{index}": index for index in range(1200)}  # more than one statement's worth of keys
    cache.set_many(many)
    assert cache.get_many(many) == many

    cache.set("page", "v2", version=2)
    assert cache.get("page") is None and cache.get("page", version=2) == "v2"
    assert cache.incr_version("page", version=2) == 3 and cache.get("page", version=3) == "v2"

    assert cache.has_key("one") and cache.delete("one") and not cache.has_key("one")
    cache.delete_many(["two", "counter"])
    assert cache.get_many(["two", "counter"]) == {}
    cache.clear()
    assert cache.get("entry") is None


def test_an_expired_entry_is_missing_everywhere_and_add_takes_its_place(cache_file):
    cache = SQLiteCache(str(cache_file), {})
    cache.set("gone", "value", timeout=0)
    assert cache.get("gone") is None and not cache.has_key("gone") and cache.get_many(["gone"]) == {}
    with pytest.raises(ValueError):
        cache.incr("gone")
    assert cache.add("gone", 1, timeout=60) is True and cache.get("gone") == 1

    cache.add("rate", 0, timeout=1)
    cache.incr("rate")  # an increment keeps the expiry the counter was added with
    assert cache.touch("rate", timeout=1)
    time.sleep(1.1)
    assert cache.get("rate") is None and not cache.touch("rate")


def test_expired_entries_are_deleted_and_the_file_stays_bounded(cache_file):
    cache = SQLiteCache(str(cache_file), {"OPTIONS": {"MAX_ENTRIES": 50}})
    cache.set("forever", "kept", timeout=None)
    for index in range(CULL_EVERY):
        cache.set(f"short-{index}", index, timeout=0 if index % 2 else 3600)
    (count,) = cache._connection().execute("SELECT COUNT(*) FROM cache_entry").fetchone()
    assert count <= 50
    assert cache.get("forever") == "kept"  # entries that never expire go last


def _increment(barrier, _index: int, path: str, times: int) -> int:
    barrier.wait()
    cache = SQLiteCache(path, {})  # all at once on a file that does not exist yet, as `make run` starts
    cache.add("counter", 0, timeout=600)
    return max(cache.incr("counter") for _ in range(times))


def test_increments_from_several_processes_at_once_are_all_counted(cache_file):
    highest = in_processes(_increment, str(cache_file), 250)

    assert SQLiteCache(str(cache_file), {}).get("counter") == PROCESSES * 250  # not one increment lost
    assert max(highest) == PROCESSES * 250


def _add_each(barrier, _index: int, cache: SQLiteCache) -> list[bool]:
    barrier.wait()  # `cache` was opened by the parent before the fork: the child opens its own connection
    return [cache.add(f"slot-{index}", "taken", timeout=600) for index in range(200)]


def test_exactly_one_process_adds_a_key(cache_file):
    cache = SQLiteCache(str(cache_file), {})
    assert cache.get("warm-up") is None  # the parent's connection exists before the fork

    added = in_processes(_add_each, cache)

    assert all(sum(column) == 1 for column in zip(*added, strict=True))


def _write_versions(barrier, _index: int, path: str) -> int:
    cache = SQLiteCache(path, {})
    barrier.wait()
    for round_number in range(300):
        cache.set_many({"order:version": round_number, "chains:version": round_number})
    return 0


def _read_versions(barrier, _index: int, path: str) -> int:
    cache = SQLiteCache(path, {})
    barrier.wait()
    torn = 0
    for _ in range(600):
        found = cache.get_many(["order:version", "chains:version"])
        torn += found["order:version"] != found["chains:version"]
    return torn


def _writer_or_reader(barrier, index: int, path: str) -> int:
    return (_write_versions if index == 0 else _read_versions)(barrier, index, path)


def test_a_reader_in_another_process_sees_all_of_a_set_many_or_none_of_it(cache_file):
    SQLiteCache(str(cache_file), {}).set_many({"order:version": -1, "chains:version": -1})

    torn = in_processes(_writer_or_reader, str(cache_file))

    assert sum(torn) == 0


def _count_requests(barrier, _index: int, requests: int) -> int:
    request = RequestFactory().post("/book/", REMOTE_ADDR="203.0.113.7")
    barrier.wait()
    return sum(
        not is_ratelimited(request, group="booking", key="ip", rate="30/h", method="POST", increment=True)
        for _ in range(requests)
    )


def test_a_rate_limit_counts_the_requests_of_every_process(settings, cache_file):
    settings.CACHES = {"default": {"BACKEND": "infrastructure.embedded_cache.SQLiteCache", "LOCATION": str(cache_file)}}

    allowed = in_processes(_count_requests, 20)  # 80 requests from one address, to four web workers

    assert sum(allowed) == 30
