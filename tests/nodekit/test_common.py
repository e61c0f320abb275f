"""nodekit/common.py on its own (the scripts' tests run it inlined, through the shipped files)."""

import argparse
import json
import os

import pytest

from nodekit.common import bounded, now_utc, rank_result, short_text, stderr_logger, write_atomically


def test_short_text_folds_white_space_and_cuts_with_an_ellipsis():
    assert short_text("  a\n\tb  c ") == "a b c"
    assert short_text(ValueError("x" * 400)) == "x" * 299 + "…"
    assert short_text("abcdef", 4) == "abc…"


def test_now_utc_is_what_the_reports_write():
    stamp = now_utc()
    assert len(stamp) == len("2025-01-01T00:00:00.000Z") and stamp.endswith("Z")


@pytest.mark.parametrize(
    ("text", "message"), [("nan", "outside"), ("inf", "outside"), ("0", "outside"), ("x", "number")]
)
def test_bounded_refuses_what_is_not_a_finite_number_in_range(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        bounded(float, 1.0, 10.0)(text)
    assert bounded(int, 1, 10)("10") == 10


def test_stderr_logger_tags_each_line(capsys):
    stderr_logger("kit")("hello")
    assert capsys.readouterr().err == f"[kit {os.getpid()}] hello\n"


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    write_atomically(str(target), "new")
    assert target.read_text() == "new"
    assert [path.name for path in tmp_path.iterdir()] == ["report.json"]


def test_rank_result_records_the_error_and_raises_it_again(tmp_path):
    job = {"out_dir": str(tmp_path)}
    with pytest.raises(RuntimeError), rank_result(job, 1, error_limit=20) as result:
        result["started"] = True
        raise RuntimeError("the card fell off the bus, twice")
    written = json.loads((tmp_path / "rank1.json").read_text())
    assert written == {"rank": 1, "started": True, "error": "RuntimeError: the c…"}
