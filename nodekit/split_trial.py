#!/usr/bin/env python3
"""Binôme split trial: does the second card of the pair pay off for this model, and which way of sharing?

Trains the same reduced dataset, at the same precision and with the same examples, in up to five runs:

==================  =====  ===========================================================================================
run                 cards  what the two cards share
==================  =====  ===========================================================================================
``single``          1      nothing: the whole model and the whole global batch B on card 0
``ddp``             2      a full copy of the model each (DistributedDataParallel), B/2 examples per card: global B
``fsdp``            2      parameters, gradients and optimizer states sharded (torch FSDP2 ``fully_shard``), B/2 each
``pipeline``        2      layers split: the first half of the model's layers on card 0, the second half on card 1;
                           card 0 sends its activations to card 1, card 1 sends their gradient back; global B
``ddp_bigger_batch`` 2     DDP with the single card's batch on each card: the same per-card batch B, global 2B;
                           compared with ``single`` in examples per second
==================  =====  ===========================================================================================

Usage::

    python split_trial.py [--device auto|cuda|cpu] [--strategies ddp,fsdp,pipeline] [--no-bigger-batch]
        [--examples 512] [--batch 32] [--steps 50] [--warmup 20] [--precision fp32|bf16] [--hidden 512]
        [--layers 4] [--plugin my_model.py] [--card-memory-mib N] [--output report.json] [--timeout 1800]

``--steps`` counts every step, warm-up included; by default the first 20 of 50 are run and discarded (the guide's
range is 20–50). The dataset holds ``--examples`` examples and the steps cycle through it. Pick the cards with
CUDA_VISIBLE_DEVICES (NVIDIA) or HIP_VISIBLE_DEVICES (ROCm): the kit uses the first two it sees. On a machine
without a GPU, ``--device cpu`` runs two gloo ranks: a check of the kit and of your plug-in, not a measure of GPUs.

Out of memory is a result, not an error. Each run that does not fit is recorded with ``status: out_of_memory``
and the others still run: a model that does not fit one card gets its two-card runs, and the portal concludes
"possible only on two cards". ``--card-memory-mib N`` imposes a card size: a run whose model state on a card
(parameters, gradients and the two AdamW moments, in fp32: 16 bytes per parameter held) exceeds N MiB is recorded
as out of memory without being started. On the CPU it is how a card's size is simulated; on a GPU the card's real
out-of-memory error is recorded the same way.

What is measured, per card: step time after warm-up (median and p90; a two-card run's step is its slowest card's),
examples per second (global batch / step time), communication time (DDP: all-reduces in flight, from a
communication hook around DDP's own all-reduce; pipeline: time in the blocking sends and receives; FSDP: not
measured separately, its collectives are inside the step), peak memory (``torch.cuda.max_memory_allocated``; on the
CPU the process's peak resident set size, interpreter included), the model state held, and an imbalance flag set
when the larger card's peak is at least 1.25 times the smaller's and at least 256 MiB above it.

Precision: ``fp32``, or ``bf16`` = forward and loss under ``torch.autocast(dtype=torch.bfloat16)``, parameters,
gradients and optimizer states in fp32. Every model is trained with ``torch.optim.AdamW(lr=1e-3)``. The report
states the precision, the example count and the batches of every run.

Plugging in your own model and a reduced copy of your dataset (``--plugin path/to/my_model.py``): a Python file
with two functions, and a third one optional::

    import torch

    def build_model():                  # a torch.nn.Module on the CPU, in fp32 (the kit moves it)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def dataset():                      # (inputs, targets): two tensors with the same first dimension,
        inputs = torch.load("reduced.pt")           # at least --examples rows; the kit takes the first --examples
        return inputs, torch.randint(0, 10, (inputs.shape[0],))

    def loss(outputs, targets):         # optional: cross-entropy for integer targets, else mean squared error
        return torch.nn.functional.cross_entropy(outputs, targets)

The file is checked before any run; a problem exits 2 with one line on stderr, ``split_trial.py: error
[<code>]: <message>``, and no traceback: ``plugin_not_found``, ``plugin_import_failed`` (the message says which
exception), ``plugin_missing_function``, ``plugin_bad_model`` (``build_model()`` did not return a
``torch.nn.Module``), ``plugin_bad_dataset`` (not two tensors with the same first dimension),
``plugin_dataset_too_small`` (fewer rows than ``--examples``). The pipeline run needs the layers in order: a
``torch.nn.Sequential`` of at least two modules; any other model gets ``status: not_applicable``.

Output: one JSON report, schema ``binome.split-trial/2``, written to ``--output`` (a short summary is then
printed on stdout), or printed on stdout; logs go to stderr. The report carries codes and figures only: the
portal writes the conclusion in the page's language, beside the hypothesis written at booking. Exit status: 0
when every run has a result (out of memory and not applicable are results), 1 when a run failed or timed out (the
report is still written), 2 on bad arguments, a bad plug-in, or without torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import signal
import statistics
import sys
import time
import traceback
import warnings

try:
    import resource
except ImportError:  # not Unix: no peak RSS (the kit targets Linux nodes)
    resource = None

from nodekit.common import (
    bounded,
    join_process_group,
    now_utc,
    rank_result,
    run_ranks,
    short_text,
    stderr_logger,
    synchronizer,
    write_atomically,
)

torch = None  # imported by _load_torch(), after the arguments are checked: --help and usage errors need no torch

SCHEMA = "binome.split-trial/2"
SEED = 20240917
LEARNING_RATE = 1e-3
DEFAULT_OUTPUTS = 16
IMBALANCE_RATIO = 1.25
IMBALANCE_MIN_DIFF_MIB = 256.0
STATE_BYTES_PER_PARAMETER = 16  # fp32 parameter, gradient and the two AdamW moments
ERROR_LIMIT = 1500
TWO_CARD_STRATEGIES = ("ddp", "fsdp", "pipeline")
BIGGER_BATCH = "ddp_bigger_batch"


def _load_torch() -> str | None:
    """Import torch into this module's globals; returns why it failed, or None."""
    global torch
    if torch is None:
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: harmless
        try:
            import torch as imported
        except Exception as exc:  # ImportError, or a broken install failing in its own way
            return f"{type(exc).__name__}: {exc}"
        torch = imported
    return None


log = stderr_logger("split-trial")  # human-readable progress: stdout carries the report (or the summary) only


def _num(value: float, digits: int = 3) -> float:
    """A finite, non-negative float for the report (timing noise can make a difference dip below zero)."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"non-finite measurement: {value!r}")
    return round(max(value, 0.0), digits)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------


def _strategies(text: str) -> tuple:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in TWO_CARD_STRATEGIES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(TWO_CARD_STRATEGIES)}, got {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="split_trial.py",
        description="Binôme split trial: one card, then two (DDP, FSDP, pipeline), same data and precision; JSON "
        "report. Exit 0 done, 1 a run failed, 2 usage or plug-in.",
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--strategies", type=_strategies, default=TWO_CARD_STRATEGIES, help="two-card runs (default: all three)"
    )
    parser.add_argument("--no-bigger-batch", action="store_true", help="skip the twice-the-global-batch DDP run")
    parser.add_argument("--examples", type=bounded(int, 2, 10_000_000), default=512, help="dataset size")
    parser.add_argument("--batch", type=bounded(int, 2, 1_000_000), default=32, help="global batch (even)")
    parser.add_argument("--steps", type=bounded(int, 2, 1_000_000), default=50, help="steps, warm-up included")
    parser.add_argument("--warmup", type=bounded(int, 0, 1_000_000), default=20, help="untimed first steps")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--hidden", type=bounded(int, 1, 65_536), default=512, help="default model width")
    parser.add_argument("--layers", type=bounded(int, 1, 256), default=4, help="default model depth")
    parser.add_argument("--plugin", default=None, help="path to your .py with build_model() and dataset()")
    parser.add_argument(
        "--card-memory-mib",
        type=bounded(float, 0.001, 1e9),
        default=None,
        help="simulated card size: a run whose model state on a card exceeds it is out of memory",
    )
    parser.add_argument("--output", default=None, help="write the JSON report here (default: stdout)")
    parser.add_argument("--timeout", type=bounded(float, 1.0, 86_400.0), default=1800.0, help="seconds, whole run")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch % 2:
        parser.error(f"--batch {args.batch} must be even: each of the two cards gets half of it")
    if args.examples < args.batch:
        parser.error(f"--examples {args.examples} must be at least --batch {args.batch}")
    if args.warmup >= args.steps:
        parser.error(f"--warmup {args.warmup} must be smaller than --steps {args.steps} (steps include warm-up)")
    if args.output:
        directory = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(directory):
            parser.error(f"--output: directory {directory} does not exist")
    return args


# --------------------------------------------------------------------------------------------------------------
# Models and data: the default MLP, or the researcher's plug-in file
# --------------------------------------------------------------------------------------------------------------


class PluginError(Exception):
    """A plug-in file the kit refuses before any run; `code` says why (see the docstring)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def default_parts(hidden: int, layers: int, examples: int):
    """(model, (inputs, targets), loss): an MLP regressing a fixed random teacher on seeded Gaussian inputs."""
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, DEFAULT_OUTPUTS))
    generator = torch.Generator().manual_seed(SEED + 1)
    teacher = torch.randn(hidden, DEFAULT_OUTPUTS, generator=generator) / math.sqrt(hidden)
    inputs = torch.randn(examples, hidden, generator=generator)
    return model, (inputs, torch.tanh(inputs @ teacher)), torch.nn.functional.mse_loss


def _default_loss(outputs, targets):
    if not targets.is_floating_point():
        return torch.nn.functional.cross_entropy(outputs.float(), targets)
    return torch.nn.functional.mse_loss(outputs.float(), targets.float())


def load_plugin(path: str, examples: int):
    """(model, (inputs, targets), loss) from the plug-in file, checked; raises PluginError with a code."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise PluginError("plugin_not_found", f"--plugin: no file {path}")
    name = "binome_split_trial_plugin_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))  # its sibling modules import as they would next to it
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError("not a Python source file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except BaseException as exc:  # a SyntaxError, an ImportError, anything the file raises at import, or exit()
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise PluginError(
            "plugin_import_failed", f"{path} could not be imported: {type(exc).__name__}: {exc}"
        ) from None
    for function in ("build_model", "dataset"):
        if not callable(getattr(module, function, None)):
            raise PluginError("plugin_missing_function", f"{path} has no function {function}()")
    loss = getattr(module, "loss", None)
    if loss is not None and not callable(loss):
        raise PluginError("plugin_missing_function", f"{path}: loss is not a function")
    try:
        model = module.build_model()
    except Exception as exc:
        raise PluginError("plugin_bad_model", f"build_model() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise PluginError(
            "plugin_bad_model", f"build_model() must return a torch.nn.Module, not {type(model).__name__}"
        )
    try:
        data = module.dataset()
    except Exception as exc:
        raise PluginError("plugin_bad_dataset", f"dataset() raised {type(exc).__name__}: {exc}") from None
    if (
        not isinstance(data, (tuple, list))
        or len(data) != 2
        or not all(isinstance(part, torch.Tensor) and part.dim() >= 1 for part in data)
    ):
        raise PluginError("plugin_bad_dataset", "dataset() must return (inputs, targets): two tensors")
    inputs, targets = data
    if inputs.shape[0] != targets.shape[0]:
        raise PluginError(
            "plugin_bad_dataset",
            f"dataset(): inputs have {inputs.shape[0]} rows and targets {targets.shape[0]}: they must match",
        )
    if inputs.shape[0] < examples:
        raise PluginError(
            "plugin_dataset_too_small", f"dataset() has {inputs.shape[0]} rows; --examples asks for {examples}"
        )
    return model, (inputs[:examples], targets[:examples]), loss or _default_loss


def build_parts(job: dict):
    torch.manual_seed(job["seed"])  # the same initial weights in every process
    if job["plugin"]:
        return load_plugin(job["plugin"], job["examples"])
    return default_parts(job["hidden"], job["layers"], job["examples"])


def pipeline_stages(model) -> list | None:
    """The model's layers in order, or None when the model is not an nn.Sequential of at least two modules."""
    if not isinstance(model, torch.nn.Sequential) or len(model) < 2:
        return None
    return list(model)


def _state_mib(modules) -> float:
    count = sum(p.numel() for module in modules for p in module.parameters() if p.requires_grad)
    return count * STATE_BYTES_PER_PARAMETER / 2**20


def planned_state_mib(model, strategy: str) -> list[float] | None:
    """The model state each card of `strategy` would hold (MiB), or None when the strategy does not apply."""
    whole = _state_mib([model])
    if strategy == "single":
        return [whole]
    if strategy in ("ddp", BIGGER_BATCH):
        return [whole, whole]
    if strategy == "fsdp":
        return [whole / 2, whole / 2]
    stages = pipeline_stages(model)
    if stages is None:
        return None
    cut = len(stages) // 2
    return [_state_mib(stages[:cut]), _state_mib(stages[cut:])]


# --------------------------------------------------------------------------------------------------------------
# One process of a run (a torch.multiprocessing spawn child)
# --------------------------------------------------------------------------------------------------------------


class CommTimer:
    """DDP communication hook state: when each bucket's all-reduce was launched and when its result was ready."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.intervals: list = []
        self.step_start = None

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin_step(self) -> None:
        self.intervals = []
        self.step_start = self.mark()

    @staticmethod
    def hook(state: CommTimer, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        start = state.mark()
        future = default_hooks.allreduce_hook(None, bucket)  # DDP's own averaging all-reduce, unchanged

        def done(fut):
            state.intervals.append((start, state.mark()))
            return fut.value()

        return future.then(done)

    def measure(self) -> float:
        """Milliseconds of the step that just ended with an all-reduce in flight; call after synchronising."""
        if not self.intervals:
            return 0.0
        if self.cuda:
            spans = [(self.step_start.elapsed_time(a), self.step_start.elapsed_time(b)) for a, b in self.intervals]
        else:
            spans = [((a - self.step_start) * 1e3, (b - self.step_start) * 1e3) for a, b in self.intervals]
        spans.sort()
        in_flight, current_start, current_end = 0.0, *spans[0]
        for start, end in spans[1:]:
            if start > current_end:
                in_flight += current_end - current_start
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        in_flight += current_end - current_start
        return max(in_flight, 0.0)


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.lower().startswith("model name"):
                return short_text(line.split(":", 1)[1], 120)
    return short_text(platform.processor() or platform.machine() or "CPU", 120)


def _peak_rss_mib() -> float:
    if resource is None:
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _host_memory_mib() -> float:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return 0.0


def _rank_main(rank: int, job: dict) -> None:
    """Entry point of one process: writes rank<N>.json in job["out_dir"], raises on failure."""
    with rank_result(job, rank, error_limit=ERROR_LIMIT) as result:
        problem = _load_torch()
        if problem:
            raise ImportError(problem)
        try:
            result.update(_run_rank(rank, job))
        except Exception as exc:
            oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
            if oom is not None and isinstance(exc, oom):
                result["out_of_memory"] = True
            raise
    # The work is done and its result is on disk: leave without the interpreter's teardown, where a gloo thread
    # still being destroyed sometimes aborts the process and turns a successful rank into a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _batches(data, job: dict, rank: int, device) -> list:
    """This rank's share of each global batch, on its device, built once before timing starts."""
    inputs, targets = data
    strategy, world, batch = job["strategy"], job["world"], job["global_batch"]
    if strategy in ("single", "pipeline"):
        start, size = 0, batch  # pipeline: both stages see the whole batch
    else:
        size = batch // world
        start = rank * size
    examples = inputs.shape[0]
    batches = []
    for index in range(max(examples // batch, 1)):
        rows = [(index * batch + start + offset) % examples for offset in range(size)]
        picked = torch.tensor(rows, dtype=torch.long)
        batches.append((inputs[picked].to(device), targets[picked].to(device)))
    return batches


def _run_rank(rank: int, job: dict) -> dict:
    import torch.distributed as dist

    world, cuda, strategy = job["world"], job["device_type"] == "cuda", job["strategy"]
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        torch.cuda.reset_peak_memory_stats(device)
        if job["precision"] == "bf16" and not torch.cuda.is_bf16_supported():
            raise RuntimeError(f"{torch.cuda.get_device_name(device)} does not support bf16")
        name = torch.cuda.get_device_name(device)
        total_mib = torch.cuda.get_device_properties(device).total_memory / 2**20
    else:
        device = torch.device("cpu")
        torch.set_num_threads(job["threads"])
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both ranks are on this host
        name, total_mib = _cpu_name(), _host_memory_mib()
    if world > 1:
        join_process_group(dist, job, rank, device, timeout_s=max(job["timeout_s"], 10.0))
    try:
        model, data, loss_fn = build_parts(job)
        held = model
        if strategy == "pipeline":
            stages = pipeline_stages(model)
            cut = len(stages) // 2
            held = torch.nn.Sequential(*(stages[:cut] if rank == 0 else stages[cut:]))
        state_mib = _state_mib([held]) / (2 if strategy == "fsdp" else 1)
        batches = _batches(data, job, rank, device)
        del data
        held = held.to(device)

        net, timer = held, None
        if strategy in ("ddp", BIGGER_BATCH):
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(held, device_ids=[rank] if cuda else None)
            timer = CommTimer(device)
            net.register_comm_hook(timer, CommTimer.hook)
        elif strategy == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (world,))
            for module in held.children():
                if any(p.requires_grad for p in module.parameters()):
                    fully_shard(module, mesh=mesh)
            net = fully_shard(held, mesh=mesh)
        optimizer = torch.optim.AdamW(held.parameters(), lr=LEARNING_RATE)
        autocast = (
            (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16))
            if job["precision"] == "bf16"
            else contextlib.nullcontext
        )
        sync = synchronizer(torch, device)
        step_ms, comm_ms = [], []
        shape = None
        loss_value = 0.0
        for step in range(job["steps"]):
            inputs, targets = batches[step % len(batches)]
            sync()
            started = time.perf_counter()
            comm = 0.0
            if timer is not None:
                timer.begin_step()
            optimizer.zero_grad(set_to_none=True)
            if strategy == "pipeline":
                if rank == 0:
                    with autocast():
                        activations = net(inputs)
                    outgoing = activations.float().contiguous()
                    if shape is None:  # tell the second stage what to receive, once
                        header = torch.zeros(9, dtype=torch.long)
                        header[0] = outgoing.dim()
                        header[1 : 1 + outgoing.dim()] = torch.tensor(outgoing.shape)
                        dist.send(header.to(device), dst=1)
                        shape = tuple(outgoing.shape)
                    sync()
                    mark = time.perf_counter()
                    dist.send(outgoing, dst=1)
                    gradient = torch.empty_like(outgoing)
                    dist.recv(gradient, src=1)
                    sync()
                    comm = (time.perf_counter() - mark) * 1e3
                    activations.backward(gradient.to(activations.dtype))
                else:
                    if shape is None:
                        header = torch.zeros(9, dtype=torch.long, device=device)
                        dist.recv(header, src=0)
                        header = header.cpu()
                        shape = tuple(int(size) for size in header[1 : 1 + int(header[0])])
                    incoming = torch.empty(shape, dtype=torch.float32, device=device)
                    sync()
                    mark = time.perf_counter()
                    dist.recv(incoming, src=0)
                    comm = (time.perf_counter() - mark) * 1e3
                    incoming.requires_grad_(True)
                    with autocast():
                        loss = loss_fn(net(incoming), targets)
                    loss.backward()
                    sync()
                    mark = time.perf_counter()
                    dist.send(incoming.grad.contiguous(), dst=0)
                    sync()
                    comm += (time.perf_counter() - mark) * 1e3
                    loss_value = float(loss.detach().float().item()) if step == job["steps"] - 1 else loss_value
            else:
                with autocast():
                    loss = loss_fn(net(inputs), targets)
                if step == 0 and (not isinstance(loss, torch.Tensor) or loss.numel() != 1):
                    raise TypeError("the loss must be a scalar tensor")
                loss.backward()
            optimizer.step()
            sync()
            elapsed = (time.perf_counter() - started) * 1e3
            if step >= job["warmup"]:
                step_ms.append(elapsed)
                if timer is not None:
                    comm = timer.measure()
                comm_ms.append(min(comm, elapsed))
        if strategy != "pipeline":
            loss_value = float(loss.detach().float().item())
        peak_rss = _peak_rss_mib()
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else peak_rss
        return {
            "device": f"cuda:{rank}" if cuda else "cpu",
            "device_name": name,
            "memory_total_mib": total_mib,
            "peak_memory_mib": peak,
            "model_state_mib": state_mib,
            "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "threads": torch.get_num_threads(),
            "step_ms": step_ms,
            "comm_ms": comm_ms,
            "loss_finite": math.isfinite(loss_value),
        }
    finally:
        if world > 1 and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------------------
# The supervisor (this process): checks the plug-in, plans and spawns each run, writes the report
# --------------------------------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def _usable_cpus() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def run_ranks_of(job: dict, world: int, deadline: float) -> tuple[list[dict], str | None, bool]:
    """Spawn `world` ranks, wait for them until `deadline`; returns (rank results, error or None, timed out)."""
    import torch.multiprocessing as torch_mp

    budget = deadline - time.monotonic()
    if budget < 1.0:
        return [], "timed out before it could start (--timeout spent)", True
    job = dict(job, timeout_s=budget)
    ranks, timed_out, error = run_ranks(
        torch_mp, _rank_main, job, world=world, deadline=deadline, grace_s=10.0, reraise=(Interrupted,)
    )
    failure = None
    if timed_out:
        failure = f"timed out after {budget:.0f} s (--timeout): ranks killed"
    elif error is not None:  # a rank raised or died: torch has stopped the others
        lines = [line for line in str(error).splitlines() if line.strip()]
        failure = short_text(lines[-1] if lines else error, ERROR_LIMIT)
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    if errors and not timed_out:  # the rank's own message says more than the exception torch relays
        failure = "; ".join(errors)
    elif failure is None and len(ranks) != world:
        failure = f"{len(ranks)} of {world} ranks reported"
    return ranks, (short_text(failure, ERROR_LIMIT) if failure else None), timed_out


def _imbalance(peaks: list[float]) -> dict:
    low, high = min(peaks), max(peaks)
    ratio = high / low if low > 0 else (1.0 if high == 0 else 1e6)
    flag = len(peaks) == 2 and ratio >= IMBALANCE_RATIO and high - low >= IMBALANCE_MIN_DIFF_MIB
    return {"flag": bool(flag), "max_over_min": _num(min(ratio, 1e6), 3)}


def _run_entry(strategy: str, args: argparse.Namespace) -> dict:
    cards = 1 if strategy == "single" else 2
    global_batch = args.batch * 2 if strategy == BIGGER_BATCH else args.batch
    per_card = global_batch if strategy in ("single", "pipeline") else global_batch // 2
    return {
        "strategy": strategy,
        "cards": cards,
        "status": "failed",
        "global_batch": global_batch,
        "per_card_batch": per_card,
        "examples_processed": args.steps * global_batch,
    }


def measure(strategy: str, args: argparse.Namespace, base_job: dict, planned, deadline: float, cpus: int) -> dict:
    """One run's entry in the report: measured, or why not (out of memory, not applicable, failed)."""
    entry = _run_entry(strategy, args)
    if planned is None:
        entry.update(status="not_applicable", code="pipeline_needs_sequential")
        return entry
    entry["per_card"] = [{"rank": rank, "model_state_mib": _num(mib, 3)} for rank, mib in enumerate(planned)]
    if args.card_memory_mib is not None and max(planned) > args.card_memory_mib:
        entry.update(status="out_of_memory", code="model_state_over_card_memory")
        return entry
    world = entry["cards"]
    job = dict(
        base_job,
        strategy=strategy,
        global_batch=entry["global_batch"],
        threads=max(cpus // world, 1),
    )
    ranks, error, timed_out = run_ranks_of(job, world, deadline)
    if error and "address already in use" in error.lower() and not timed_out:  # the free port was taken meanwhile
        ranks, error, timed_out = run_ranks_of(job, world, deadline)
    if any(rank.get("out_of_memory") for rank in ranks):
        entry.update(status="out_of_memory", code="device_out_of_memory", error=short_text(error or "", ERROR_LIMIT))
        return entry
    if error:
        entry.update(status="failed", code="timed_out" if timed_out else "rank_failed", error=error)
        return entry
    ranks = sorted(ranks, key=lambda rank: rank["rank"])
    steps = [_median(rank["step_ms"]) for rank in ranks]
    step = max(steps)
    entry.update(
        status="ok",
        steps_measured=min(len(rank["step_ms"]) for rank in ranks),
        step_time_ms_median=_num(step),
        step_time_ms_p90=_num(max(_p90(rank["step_ms"]) for rank in ranks)),
        examples_per_s=_num(entry["global_batch"] / (step / 1e3), 1) if step > 0 else 0.0,
        loss_finite=all(rank.get("loss_finite", True) for rank in ranks),
        per_card=[
            {
                "rank": int(rank["rank"]),
                "device_name": short_text(rank["device_name"], 120),
                "step_time_ms_median": _num(_median(rank["step_ms"])),
                "peak_memory_mib": _num(rank["peak_memory_mib"], 1),
                "memory_total_mib": _num(rank["memory_total_mib"], 1),
                "model_state_mib": _num(rank["model_state_mib"], 3),
            }
            for rank in ranks
        ],
    )
    if world == 2:
        if strategy != "fsdp":  # FSDP's collectives are inside its forward and backward: not timed apart
            entry["comm_time_ms_median"] = _num(max(_median(rank["comm_ms"]) for rank in ranks))
        entry["imbalance"] = _imbalance([rank["peak_memory_mib"] for rank in ranks])
    entry["_parameters"] = int(ranks[0]["parameters"])
    entry["_device_names"] = [row["device_name"] for row in entry["per_card"]]
    return entry


def resolve_device(requested: str) -> tuple[str, str, str, str]:
    """(device_type, device_kind, torch backend, backend label) for --device."""
    gpus = torch.cuda.is_available() and torch.cuda.device_count() > 0  # neither creates a CUDA context
    if requested == "cuda" and not gpus:
        raise ValueError("--device cuda: torch sees no CUDA or ROCm device (CUDA_VISIBLE_DEVICES? a CPU build?)")
    if requested == "cpu" or not gpus:
        return "cpu", "cpu", "gloo", "gloo"
    rocm = getattr(torch.version, "hip", None) is not None
    return "cuda", ("rocm" if rocm else "cuda"), "nccl", ("rccl" if rocm else "nccl")


def _environment(args: argparse.Namespace, device: tuple[str, str, str, str]) -> dict:
    """What was held constant and how it was measured: the report's `environment` (figures and codes)."""
    device_type, device_kind, _torch_backend, backend = device
    environment = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device_kind": device_kind,
        "backend": backend,
        "device_names": [],
        "precision": args.precision,
        "examples": args.examples,
        "global_batch": args.batch,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "steps_measured": args.steps - args.warmup,
        "model": "plugin" if args.plugin else "default_mlp",
        "seed": SEED,
        "peak_memory_source": "rss" if device_type == "cpu" else "max_memory_allocated",
    }
    if not args.plugin:
        environment["default_model"] = {"hidden": args.hidden, "layers": args.layers}
    if args.card_memory_mib is not None:
        environment["card_memory_mib"] = _num(args.card_memory_mib, 3)
    return environment


def plan(args: argparse.Namespace) -> tuple[list[str], dict]:
    """The runs, in order, and the model state each would hold per card (None: not applicable).

    Builds the model once here (the plug-in is checked by then): PluginError propagates."""
    torch.manual_seed(SEED)
    if args.plugin:
        model, _data, _loss = load_plugin(args.plugin, args.examples)
    else:
        model, _data, _loss = default_parts(args.hidden, args.layers, args.examples)
    strategies = ["single", *args.strategies] + ([] if args.no_bigger_batch else [BIGGER_BATCH])
    return strategies, {strategy: planned_state_mib(model, strategy) for strategy in strategies}


def run(args: argparse.Namespace) -> dict:
    started, started_at = time.monotonic(), now_utc()
    deadline = started + args.timeout
    device = resolve_device(args.device)
    device_type, _kind, torch_backend, _backend = device
    cpus = _usable_cpus()
    environment = _environment(args, device)
    report: dict = {"schema": SCHEMA, "started_at": started_at, "duration_s": 0.0, "environment": environment}
    strategies, planned = plan(args)
    base_job = {
        "device_type": device_type,
        "backend": torch_backend,
        "precision": args.precision,
        "examples": args.examples,
        "steps": args.steps,
        "warmup": args.warmup,
        "hidden": args.hidden,
        "layers": args.layers,
        "plugin": os.path.abspath(args.plugin) if args.plugin else None,
        "seed": SEED,
    }
    runs = []
    try:
        for strategy in strategies:
            if strategy != "single" and device_type == "cuda" and torch.cuda.device_count() < 2:
                entry = _run_entry(strategy, args)
                entry.update(code="needs_two_cards", error=f"torch sees {torch.cuda.device_count()} card")
                runs.append(entry)
                continue
            log(f"{strategy}: {args.precision}, {args.steps} steps ({args.warmup} warm-up)")
            runs.append(measure(strategy, args, base_job, planned[strategy], deadline, cpus))
    except Interrupted as exc:
        report["error"] = short_text(str(exc), ERROR_LIMIT)
    for entry in runs:
        parameters = entry.pop("_parameters", None)
        names = entry.pop("_device_names", None)
        if parameters is not None:
            environment["parameters"] = parameters
        if names and len(names) >= len(environment["device_names"]):
            environment["device_names"] = names
    report["runs"] = runs
    single_status = runs[0]["status"] if runs and runs[0]["strategy"] == "single" else None
    two_card_ok = any(entry["status"] == "ok" for entry in runs if entry["cards"] == 2)
    report["findings"] = {  # codes only: the portal words them, in the page's language
        "fits_one_card": single_status == "ok",
        "possible_only_on_two_cards": single_status == "out_of_memory" and two_card_ok,
    }
    failed = [entry["strategy"] for entry in runs if entry["status"] == "failed"]
    if failed and "error" not in report:
        report["error"] = short_text(
            "; ".join(
                f"{entry['strategy']}: {entry.get('error', entry.get('code'))}"
                for entry in runs
                if entry["status"] == "failed"
            ),
            ERROR_LIMIT,
        )
    report["duration_s"] = _num(time.monotonic() - started, 2)
    return report


def summary(report: dict) -> str:
    """A terminal line per run (English, for the person at the shell; the portal writes the conclusion)."""
    lines = []
    if report.get("findings", {}).get("possible_only_on_two_cards"):
        lines.append("The model does not fit one card: possible only on two cards.")
    for entry in report.get("runs", []):
        line = f"{entry['strategy']:>16} ({entry['cards']} card{'s' if entry['cards'] > 1 else ''}): {entry['status']}"
        if entry["status"] == "ok":
            line += (
                f", {entry['step_time_ms_median']:.1f} ms/step at global batch {entry['global_batch']}, "
                f"{entry['examples_per_s']:.0f} examples/s"
            )
            if entry.get("imbalance", {}).get("flag"):
                line += ", memory unbalanced"
        elif entry.get("code"):
            line += f" ({entry['code']})"
        lines.append(line)
    return "\n".join(lines) + "\nUpload the report on your order page for the conclusion beside your hypothesis."


def write_report(report: dict, output: str | None) -> None:
    text = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if not output:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomically(output, text)
    sys.stdout.write(summary(report) + "\n")
    sys.stdout.flush()


def _usage_error(code: str, message: str) -> int:
    sys.stderr.write(f"split_trial.py: error [{code}]: {short_text(message, ERROR_LIMIT)}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # exits 2 with a message on stderr
    problem = _load_torch()
    if problem:
        sys.stderr.write(
            f"split_trial.py needs PyTorch, which {sys.executable} cannot import ({short_text(problem)}).\n"
            "Install the torch build that matches the node (CUDA or ROCm), e.g. `pip install torch`, or run the "
            "kit with the Python of your training environment. Nothing was run.\n"
        )
        return 2
    try:
        resolve_device(args.device)
    except ValueError as exc:
        return _usage_error("no_device", str(exc))
    if args.plugin:
        try:
            load_plugin(args.plugin, args.examples)  # checked before any run: a clear code, no traceback
        except PluginError as exc:
            return _usage_error(exc.code, str(exc))

    def stop(signum, _frame):
        raise Interrupted(f"interrupted by signal {signal.Signals(signum).name}: ranks killed")

    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, stop)
    try:
        report = run(args)
    except Exception as exc:  # a bug of ours: still a report that says so
        traceback.print_exc(file=sys.stderr)
        report = {
            "schema": SCHEMA,
            "started_at": now_utc(),
            "environment": _environment(args, resolve_device(args.device)),
            "runs": [],
            "error": short_text(f"split_trial.py internal error: {type(exc).__name__}: {exc}", ERROR_LIMIT),
        }
    write_report(report, args.output)
    return 1 if report.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
