"""The benchmarks' one convention: every recorded result is an envelope, every script is in
the one list, the harness writes envelopes and runs functions in fresh processes, and (slow)
every script's ``--quick`` run writes a valid envelope and its PNG."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a package at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks._fresh_process import ChildError, FreshProcess, run_in_fresh_process  # noqa: E402
from benchmarks._harness import ENVELOPE_KEYS, Recording, envelope_problems, pyplot  # noqa: E402
from benchmarks._registry import BENCHMARKS, scripts  # noqa: E402

RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
BY_NAME = {b.name: b for b in BENCHMARKS}


def test_results_exist() -> None:
    assert len(RESULTS) >= 18


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_recorded_result_is_an_envelope(path: Path) -> None:
    document = json.loads(path.read_text())
    assert envelope_problems(document) == []
    assert path.stem in BY_NAME, f"{path.name} is produced by no entry of benchmarks/_registry.py"
    assert document["benchmark"] == BY_NAME[path.stem].script
    absolute = [a for a in document["argv"] or () if a.startswith("/")]
    assert absolute == [], f"{path.name} records paths of the machine that ran it"


def test_recording_keeps_no_path_of_the_machine() -> None:
    inside = str(ROOT / "benchmarks" / "results" / "x.json")
    argv = ["--json", inside, "--ckpt", "/scratch/run7/model.ckpt", "--seeds", "0"]
    record = Recording(str(ROOT / "benchmarks" / "vocabulary.py"), argv)
    assert record.argv == ["benchmarks/vocabulary.py", "--json", "benchmarks/results/x.json",
                           "--ckpt", "model.ckpt", "--seeds", "0"]  # fmt: skip


def test_every_script_is_in_the_one_list() -> None:
    listed = {b.script for b in BENCHMARKS}
    assert set(scripts()) == listed
    assert len(scripts()) == 18
    assert len(BY_NAME) == len(BENCHMARKS), "entry names (the JSON stems) must be unique"


def test_envelope_problems_name_what_is_wrong() -> None:
    good = {"benchmark": "data", "argv": None, "commit": None, "dirty": None, "threads": None,
            "versions": {"python": "3.11", "torch": None, "ssl_rec": None}, "results": {"a": 1},
            "load_average": {"start": None, "end": [0.5, None, 1.0]}}  # fmt: skip
    assert envelope_problems(good) == []
    bad = {**good, "load_average": {"start": [1.0, 2.0]}, "commit": "HEAD-dirty", "threads": 0}
    problems = " ".join(envelope_problems(bad))
    assert "load_average" in problems and "commit" in problems and "threads" in problems
    missing = {k: v for k, v in good.items() if k != "results"}
    assert "keys" in envelope_problems(missing)[0]


def test_recording_writes_the_envelope_then_the_png(tmp_path: Path) -> None:
    record = Recording(str(ROOT / "benchmarks" / "vocabulary.py"), ["--quick", "--json", "x"])

    def plot(results: dict) -> object:
        fig, ax = pyplot().subplots(figsize=(2, 2))
        ax.plot(results["xs"])
        return fig

    path = tmp_path / "out.json"
    record.write(path, {"xs": [1.5, 2.25]}, plot, threads=3)
    document = json.loads(path.read_text())
    assert envelope_problems(document) == []
    assert list(document) == sorted(ENVELOPE_KEYS)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert document["commit"] == head
    assert document["argv"] == ["benchmarks/vocabulary.py", "--quick", "--json", "x"]
    assert document["benchmark"] == "vocabulary" and document["threads"] == 3
    assert document["results"] == {"xs": [1.5, 2.25]}
    assert document["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "out.png"]  # no temps


def test_fresh_process_runs_the_function_in_another_interpreter() -> None:
    assert run_in_fresh_process(os.getpid) != os.getpid()
    env = {**os.environ, "BENCH_ENVELOPE_PROBE": "seven"}
    assert run_in_fresh_process(os.getenv, "BENCH_ENVELOPE_PROBE", env=env) == "seven"
    assert run_in_fresh_process(os.getenv, "BENCH_ENVELOPE_PROBE") is None
    assert run_in_fresh_process(divmod, 17, 5) == [3, 2]  # JSON: a tuple arrives as a list


def test_fresh_process_reports_the_child_error() -> None:
    with pytest.raises(ChildError, match="ZeroDivisionError"):
        run_in_fresh_process(operator.truediv, 1, 0)


def test_fresh_process_times_out() -> None:
    start = time.monotonic()
    with pytest.raises(ChildError, match="timed out"):
        run_in_fresh_process(time.sleep, 60, timeout=3)
    assert time.monotonic() - start < 30


def test_fresh_process_talks_both_ways() -> None:
    with FreshProcess(input) as child:  # input() reads the parent's line and returns it
        child.send({"seed": 3})
        assert json.loads(child.recv()) == {"value": {"seed": 3}}


FIRST_ENTRY = {}
for _bench in BENCHMARKS:
    FIRST_ENTRY.setdefault(_bench.script, _bench)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(FIRST_ENTRY))
def test_quick_run_writes_an_envelope_and_a_png(script: str, tmp_path: Path) -> None:
    bench = FIRST_ENTRY[script]
    if missing := bench.missing():
        pytest.skip(f"needs {missing}")
    out = tmp_path / f"{bench.name}.json"
    command = bench.command(str(out), quick=True)
    done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert envelope_problems(document) == []
    assert document["benchmark"] == script and "--quick" in document["argv"]
    assert out.with_suffix(".png").stat().st_size > 0
