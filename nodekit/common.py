"""Helpers the node scripts share: logging to stderr, text and time for the reports, argument bounds, and running
torch ranks in child processes that never outlive their deadline.

This module is never shipped on its own: nodekit.bundle inlines it into each script in place of the script's
`from nodekit.common import …`, so every name defined here becomes a global of the shipped file (the bundler
refuses a script that defines one of them again). Like the scripts, it runs on a node's plain `python3`, possibly
3.9: the standard library only, everywhere (torch is handed in by callers that have imported it), and no syntax
newer than 3.9 at run time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import socket
import sys
import tempfile
import time

TEXT_LIMIT = 300


def stderr_logger(tag: str):
    """A `log(message)` writing "[tag pid] message" to stderr: stdout carries the report only."""

    def log(message: str) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"[{tag} {os.getpid()}] {message}\n")
            sys.stderr.flush()

    return log


def short_text(text, limit: int = TEXT_LIMIT) -> str:
    """`text` on one line (white space folded), cut to `limit` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def now_utc() -> str:
    """The time now as the reports write it: 2025-01-01T00:00:00.000Z."""
    now = dt.datetime.now(dt.timezone.utc)  # noqa: UP017 - nodes may run Python 3.9 or 3.10 (no dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def bounded(kind, low, high):
    """An argparse type: `kind(text)`, finite and within [low, high], or a usage error that says why."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text} is outside [{low}, {high}]")
        return value

    return parse


def write_atomically(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it: a reader sees the whole file or none."""
    directory = os.path.dirname(os.path.abspath(path))
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, replaced atomically
        "w", encoding="utf-8", dir=directory, prefix=f".{os.path.basename(path)}-", suffix=".tmp", delete=False
    )
    try:
        with handle:
            handle.write(text)
        os.replace(handle.name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(handle.name)
        raise


# --------------------------------------------------------------------------------------------------------------
# torch ranks: spawned children, one result file each, killed at the deadline
# --------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A localhost TCP port free right now (the rendezvous of a process group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def synchronizer(torch, device):
    """A function that waits for the work queued on `device` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def join_process_group(dist, job: dict, rank: int, device, timeout_s: float) -> None:
    """torch.distributed.init_process_group for `rank` of the job that run_ranks() started."""
    kwargs = {
        "backend": job["backend"],
        "init_method": job["init_method"],
        "rank": rank,
        "world_size": job["world"],
        "timeout": dt.timedelta(seconds=timeout_s),
    }
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)


@contextlib.contextmanager
def rank_result(job: dict, rank: int, error_limit: int):
    """The dict a rank fills in, written to rank<N>.json in the job's directory whatever happens; an exception
    leaving the block is recorded in it as "error" (then raised again, so that the parent sees the rank fail)."""
    result: dict = {"rank": rank}
    try:
        yield result
    except BaseException as exc:
        result["error"] = short_text(f"{type(exc).__name__}: {exc}", error_limit)
        raise
    finally:
        write_atomically(os.path.join(job["out_dir"], f"rank{rank}.json"), json.dumps(result))


def run_ranks(torch_mp, entry, job: dict, *, world: int, deadline: float, grace_s: float, reraise=()):
    """Run `entry(rank, job)` in `world` spawned processes until they all end or time.monotonic() passes
    `deadline`; none outlives this call. The job gains `world`, `init_method` and `out_dir`, where each rank
    writes its result with rank_result().

    Returns (the results the ranks wrote, in rank order, without those that wrote none; True if the deadline
    killed them; the exception torch raised when a rank failed, or None). Exceptions of the `reraise` types (an
    interruption of ours) are not a rank's failure: they propagate, after the ranks are killed.
    """
    with tempfile.TemporaryDirectory(prefix="binome-ranks-") as out_dir:
        job = dict(job, world=world, out_dir=out_dir, init_method=f"tcp://127.0.0.1:{free_port()}")
        context = torch_mp.start_processes(entry, args=(job,), nprocs=world, join=False, start_method="spawn")
        timed_out, failure = False, None
        try:
            while not context.join(timeout=0.25):
                if time.monotonic() > deadline:
                    timed_out = True
                    break
        except Exception as exc:  # a rank raised or died: torch has already stopped the others
            if isinstance(exc, reraise):
                raise
            failure = exc
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join(timeout=grace_s)
        results = []
        for rank in range(world):
            path = os.path.join(out_dir, f"rank{rank}.json")
            with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as handle:
                results.append(json.load(handle))
    return results, timed_out, failure
