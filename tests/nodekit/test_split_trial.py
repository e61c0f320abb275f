"""nodekit/split_trial.py run as CI runs it (CPU, two gloo ranks); its reports pass the portal's validator.

The kit is the shipped single file (nodekit.bundle), alone in a directory, run as a subprocess under `python3 -I`,
exactly as a researcher would run it on the node, but on the CPU: one process for the single phase, two gloo ranks
for the pair. One default run (module-scoped) feeds the consistency tests; a tiny model written to tmp_path proves
the --model hook; a shadowing `torch` proves the "no torch" exit 2; --timeout 2 proves the ranks are killed and the
report still written. The validator itself, booking/split_trial_report.py, is tested on hand-made hostile inputs in
tests/booking/test_split_trial_report.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from booking.split_trial_report import parse_report
from tests.nodekit.shipped import load_shipped, shipped_script

SCRIPT = shipped_script("split_trial")
CI_ARGS = ["--device", "cpu", "--examples", "256", "--batch", "32", "--steps", "12", "--warmup", "3"]
TORCH_MISSING = (
    "torch is not importable by {python}: `make test` installs it (torch==2.13.0, the CPU build, from the extra "
    "in pyproject.toml); these tests run the split trial on the CPU and must not be skipped"
)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env.update(extra)
    return env


def run_kit(*args: str, cwd: Path = SCRIPT.parent, env: dict | None = None, flags=("-I",), timeout: float = 150):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, *flags, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env if env is not None else _env(),
        check=False,
    )
    return result, time.monotonic() - started


def _numbers(node, path=""):
    """Every number in a JSON tree, with its path (booleans are not numbers here)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _numbers(value, f"{path}[{index}]")
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield path, node


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    if importlib.util.find_spec("torch") is None:
        pytest.fail(TORCH_MISSING.format(python=sys.executable), pytrace=False)
    out = tmp_path_factory.mktemp("split-trial") / "r.json"
    result, seconds = run_kit(*CI_ARGS, "--output", str(out))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    raw = out.read_bytes()
    return {"result": result, "seconds": seconds, "raw": raw, "report": json.loads(raw)}


# --------------------------------------------------------------------------------------------------------------
# The kit on the CPU
# --------------------------------------------------------------------------------------------------------------


def test_cpu_run_exits_0_and_prints_the_conclusion(cpu_run):
    report = cpu_run["report"]
    assert report["schema"] == "binome.split-trial/1"
    assert "error" not in report
    assert cpu_run["result"].stdout.strip() == report["conclusion"]
    assert cpu_run["seconds"] < 60, f"the CI run took {cpu_run['seconds']:.1f} s"


def test_cpu_run_states_what_was_held_constant(cpu_run):
    report = cpu_run["report"]
    environment = report["environment"]
    assert environment["device_kind"] == "cpu"
    assert environment["backend"] == environment["torch_backend"] == "gloo"
    assert environment["torch"].startswith("2.")
    assert environment["precision"] == "fp32"
    assert environment["examples"] == 256
    assert environment["global_batch"] == 32
    assert environment["per_rank_batch"] == 16
    assert (environment["steps"], environment["warmup_steps"], environment["steps_measured"]) == (12, 3, 9)
    assert environment["examples_processed"] == 12 * 32
    assert len(environment["device_names"]) == 2
    assert environment["parameters"] == 4 * (512 * 512 + 512) + 512 * 16 + 16
    single, pair = report["single"], report["pair"]
    for section in (single, pair, *pair["ranks"]):
        assert section["global_batch"] == 32
        assert section["examples"] == 256
        assert section["examples_processed"] == 12 * 32
        assert section["warmup_steps"] == 3
        assert section["steps_measured"] == 12 - 3
    assert single["per_rank_batch"] == 32
    assert pair["per_rank_batch"] == 16
    assert all(rank["per_rank_batch"] == 16 for rank in pair["ranks"])
    assert report["comparison"]["same_global_batch"] is True
    assert report["comparison"]["same_examples"] is True


def test_cpu_run_measures_time_memory_and_communication(cpu_run):
    report = cpu_run["report"]
    single, pair = report["single"], report["pair"]
    assert single["step_time_ms_median"] > 0
    assert single["step_time_ms_p90"] >= single["step_time_ms_median"]
    assert single["peak_memory_mib"] > 0
    assert single["peak_rss_mib"] == single["peak_memory_mib"]  # the CPU stand-in, labelled
    assert "RSS" in report["environment"]["peak_memory_source"]
    assert [rank["rank"] for rank in pair["ranks"]] == [0, 1]
    for rank in pair["ranks"]:
        assert rank["peak_memory_mib"] > 0
        assert rank["peak_rss_mib"] == rank["peak_memory_mib"]
        assert rank["step_time_ms_median"] > 0
        assert rank["comm_time_ms_median"] > 0
        assert 0 <= rank["comm_exposed_ms_median"] <= rank["comm_time_ms_median"]
        assert 0 < rank["comm_fraction"] <= 1
        assert rank["comm_time_ms_median"] <= rank["step_time_ms_median"]
        assert rank["cpu_threads"] == report["environment"]["cpu_threads_per_rank"]
        assert rank["loss_finite"] is True
    assert pair["step_time_ms_median"] == max(rank["step_time_ms_median"] for rank in pair["ranks"])
    imbalance = pair["imbalance"]
    assert isinstance(imbalance["flag"], bool)
    peaks = [rank["peak_memory_mib"] for rank in pair["ranks"]]
    assert imbalance["max_over_min"] == pytest.approx(max(peaks) / min(peaks), abs=2e-3)
    assert imbalance["flag"] is False  # two identical CPU ranks
    assert imbalance["detail"]
    comparison = report["comparison"]
    assert comparison["speedup"] == pytest.approx(single["step_time_ms_median"] / pair["step_time_ms_median"], 1e-2)
    assert comparison["step_change"] in ("shorter", "longer", "unchanged")
    assert comparison["comm_cost_percent"] > 0


def test_cpu_run_numbers_are_finite_and_non_negative(cpu_run):
    numbers = list(_numbers(cpu_run["report"]))
    assert len(numbers) > 40
    for path, value in numbers:
        assert math.isfinite(value) and value >= 0, (path, value)


def test_cpu_run_concludes_in_words(cpu_run):
    conclusion = cpu_run["report"]["conclusion"]
    assert conclusion.endswith(".") and len(conclusion.split()) >= 8
    assert conclusion.startswith("CPU stand-in")
    assert "communication cost" in conclusion
    assert "memory balanced" in conclusion
    assert any(word in conclusion for word in ("cut the step", "longer", "unchanged"))


def test_cpu_run_report_passes_the_portal_validator(cpu_run):
    cleaned = parse_report(cpu_run["raw"])
    report = cpu_run["report"]
    assert cleaned["validation"] == {"text_format": "plain", "markup_seen": False, "dropped_keys": 0}
    assert {key: value for key, value in cleaned.items() if key != "validation"} == report


def test_custom_model_hook(tmp_path):
    (tmp_path / "tiny_model.py").write_text(
        textwrap.dedent(
            '''
            import torch

            class Pair(torch.nn.Module):
                """Two inputs, to prove tuples are unpacked into model(*inputs)."""

                def __init__(self):
                    super().__init__()
                    self.left = torch.nn.Linear(8, 4)
                    self.right = torch.nn.Linear(3, 4)

                def forward(self, a, b):
                    return self.left(a) + self.right(b)

            CALLS = []

            def build(precision):
                assert precision == "bf16", precision
                CALLS.append(precision)

                def make_batch(batch_size, generator):
                    a = torch.randn(batch_size, 8, generator=generator)
                    b = torch.randn(batch_size, 3, generator=generator)
                    labels = torch.randint(0, 4, (batch_size,), generator=generator)
                    return (a, b), labels

                return Pair(), make_batch, torch.nn.functional.cross_entropy
            '''
        )
    )
    out = tmp_path / "custom.json"
    args = ["--device", "cpu", "--examples", "64", "--batch", "16", "--steps", "6", "--warmup", "2"]
    result, _ = run_kit(*args, "--precision", "bf16", "--model", "tiny_model:build", "--output", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_bytes())
    assert report["environment"]["model"].startswith("tiny_model:build")
    assert report["environment"]["parameters"] == (8 * 4 + 4) + (3 * 4 + 4)
    assert report["environment"]["precision"] == "bf16"
    assert "autocast bf16" in report["environment"]["precision_detail"]
    assert report["single"]["steps_measured"] == 4
    assert [rank["comm_time_ms_median"] > 0 for rank in report["pair"]["ranks"]] == [True, True]
    parse_report(out.read_bytes())


def test_a_model_hook_that_breaks_fails_the_phase_with_a_report(tmp_path):
    (tmp_path / "broken.py").write_text(
        "import torch\n\n"
        "def build(precision):\n"
        "    def make_batch(batch_size, generator):\n"
        "        return torch.randn(batch_size + 1, 4, generator=generator), torch.zeros(batch_size)\n"
        "    return torch.nn.Linear(4, 1), make_batch, torch.nn.functional.mse_loss\n"
    )
    out = tmp_path / "broken.json"
    args = ["--device", "cpu", "--examples", "32", "--batch", "16", "--steps", "3", "--warmup", "1"]
    result, _ = run_kit(*args, "--model", str(tmp_path / "broken.py") + ":build", "--output", str(out))
    assert result.returncode == 1, result.stderr
    report = json.loads(out.read_bytes())
    assert "first dimension must be 16" in report["error"]
    assert report["single"] is None and report["pair"] is None
    assert "failed" in report["conclusion"]
    assert parse_report(out.read_bytes())["error"] == report["error"]


def test_timeout_kills_the_ranks_and_still_reports(tmp_path):
    out = tmp_path / "late.json"
    result, seconds = run_kit(*CI_ARGS, "--steps", "100000", "--timeout", "3", "--output", str(out))
    assert result.returncode == 1, result.stderr
    assert seconds < 25
    report = json.loads(out.read_bytes())
    assert "timed out" in report["error"]
    parse_report(out.read_bytes())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--batch", "33", "--examples", "66"], "must be even"),
        (["--examples", "100"], "multiple of --batch"),
        (["--steps", "5", "--warmup", "5"], "smaller than --steps"),
        (["--precision", "fp16"], "invalid choice"),
        (["--model", "no colon"], "module:function"),
        (["--output", "/nonexistent/dir/r.json"], "does not exist"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, args, needle):
    result, _ = run_kit("--device", "cpu", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert result.stdout == ""


def test_an_unknown_model_module_exits_2(tmp_path):
    result, _ = run_kit("--device", "cpu", "--model", "surely_not_a_module_here:build", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "No module named 'surely_not_a_module_here'" in result.stderr


def test_without_torch_exit_2_with_a_clear_message(tmp_path):
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named torch (shadowed by the test)')\n")
    result, _ = run_kit(*CI_ARGS, env=_env(PYTHONPATH=str(shadow.parent)), flags=())  # -I would ignore PYTHONPATH
    assert result.returncode == 2
    assert "needs PyTorch" in result.stderr and "Nothing was run" in result.stderr
    assert result.stdout == ""


# --------------------------------------------------------------------------------------------------------------
# The kit's arithmetic and wording (pure functions: no torch needed)
# --------------------------------------------------------------------------------------------------------------


kit = load_shipped("split_trial")


def _fake_rank(rank: int, step_ms: float, comm_ms: float, peak_mib: float) -> dict:
    return {
        "rank": rank,
        "device": f"cuda:{rank}",
        "device_name": "NVIDIA H200",
        "memory_total_mib": 143771.0,
        "peak_memory_mib": peak_mib,
        "peak_rss_mib": 900.0,
        "parameters": 10,
        "threads": 8,
        "step_ms": [step_ms] * 25,
        "comm_ms": [comm_ms] * 25,
        "exposed_ms": [comm_ms / 4] * 25,
        "loss_finite": True,
    }


def _fake_report(single_ms: float, pair: list[dict]) -> dict:
    args = kit.parse_args(["--device", "cuda", "--steps", "30", "--warmup", "5"])
    single = kit._single_section([_fake_rank(0, single_ms, 0.0, 2000.0)], args)
    pair_section = kit._pair_section(pair, args, "card")
    report = {
        "schema": kit.SCHEMA,
        "environment": {"device_kind": "cuda"},
        "single": single,
        "pair": pair_section,
        "comparison": kit._comparison(single, pair_section),
    }
    report["conclusion"] = kit.conclude(report)
    return report


def test_conclusion_of_a_pair_that_pays_off():
    report = _fake_report(12.4, [_fake_rank(0, 7.3, 0.876, 1200.0), _fake_rank(1, 7.2, 0.8, 1210.0)])
    comparison = report["comparison"]
    assert comparison["step_change"] == "shorter"
    assert comparison["step_change_percent"] == pytest.approx(41.1, abs=0.1)
    assert comparison["speedup"] == pytest.approx(12.4 / 7.3, abs=1e-3)
    assert comparison["comm_cost_percent"] == 12.0
    assert report["pair"]["imbalance"]["flag"] is False
    assert report["conclusion"].startswith("two cards cut the step by 41 % (12.4 → 7.3 ms per step of 32)")
    assert "at 12 % communication cost" in report["conclusion"]
    assert "memory balanced" in report["conclusion"]


def test_conclusion_of_an_unbalanced_split():
    report = _fake_report(10.0, [_fake_rank(0, 9.0, 1.0, 0.23 * 143771), _fake_rank(1, 10.5, 1.0, 0.96 * 143771)])
    imbalance = report["pair"]["imbalance"]
    assert imbalance["flag"] is True
    assert imbalance["max_over_min"] == pytest.approx(96 / 23, abs=1e-3)
    assert report["comparison"]["step_change"] == "longer"
    assert report["pair"]["step_time_ms_median"] == 10.5  # the slowest rank sets the pace
    assert "made the step 5 % longer" in report["conclusion"]
    assert "unbalanced split: card 1 at 96 %" in report["conclusion"]
    assert "card 0 at 23 %" in report["conclusion"]
    for path, value in _numbers(report):
        assert math.isfinite(value) and value >= 0, (path, value)


def test_small_differences_are_not_an_imbalance():
    report = _fake_report(10.0, [_fake_rank(0, 9.96, 1.0, 100.0), _fake_rank(1, 9.95, 1.0, 200.0)])
    assert report["pair"]["imbalance"]["flag"] is False  # 2× but only 100 MiB apart
    assert report["comparison"]["step_change"] == "unchanged"
    assert "left the step unchanged" in report["conclusion"]
