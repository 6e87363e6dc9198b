"""Every code snippet in README.md and docs/*.md runs, in order, in one scratch directory.

Snippets are written for the real sizes (1M synthetic rows, Criteo files); here they run
with tiny overrides: every ``ssl-rec`` command gets small data and one epoch appended,
Python snippets get the exact-string substitutions of :data:`TINY`, named input files are
generated, benchmarks run ``--quick`` with their JSON in the scratch directory, and ``make``
targets are dry-run (``make -n``: the demo and the suite itself are too long to nest).
``text`` blocks are layouts, not code.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ssl_rec.cli import instantiate, run
from ssl_rec.data import SyntheticClickModel, SyntheticConfig, write_criteo_tsv

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SYNTHETIC = ["--data.init_args.n_train=1500", "--data.init_args.n_val=300",
             "--data.init_args.n_test=300", "--data.init_args.batch_size=300",
             "--data.init_args.synthetic.cardinality_scale=0.0002"]  # fmt: skip
QUICK = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
TINY = {  # Python snippets: exact text -> tiny stand-in
    '"--data.init_args.n_train=200000"': ", ".join(f'"{a}"' for a in SYNTHETIC),
    "SyntheticCTRDataModule(n_train=200_000)": (
        "SyntheticCTRDataModule(n_train=1500, n_val=300, n_test=300, batch_size=300, "
        "synthetic=__import__('ssl_rec.data').data.SyntheticConfig(cardinality_scale=0.0002))"
    ),
}


def snippets() -> list[tuple[str, str, str]]:
    """``(id, language, code)`` of every fenced block, in document order."""
    out = []
    for doc in DOCS:
        for i, match in enumerate(FENCE.finditer(doc.read_text())):
            out.append((f"{doc.name}:{i}", match[1] or "text", match[2]))
    return out


def commands(code: str) -> list[list[str]]:
    """Shell commands of a bash block (comments dropped, continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


MULTI_PROCESS = {"torchrun", "srun", "sbatch"}


def tiny_ssl_rec(argv: list[str]) -> list[str]:
    """An ``ssl-rec`` command line with small data and a short run appended."""
    command, text = argv[0], " ".join(argv)
    if command in ("export", "evaluate-embeddings"):
        extra = ["--train_rows=300", "--test_rows=300"] if command != "export" else []
        return [*(a.replace("1000000", "1500") for a in argv), *extra]
    if command in ("quantize", "explain", "monitor", "plan", "retrieve") or (
        "quantized" in text and "--config" not in text
    ):
        return list(argv)  # their data comes from the checkpoint or the model's record
    extra = [*QUICK]
    if command == "fit":
        extra.append("--trainer.max_epochs=1")
    if "criteo" in text:
        extra.append("--data.init_args.path=criteo_train.txt")
    elif "--data.path" not in text and "--ckpt_path" not in text or "synthetic" in text:
        extra += SYNTHETIC
    elif "--config" in text and "tabular" not in text and "--data.path" not in text:
        extra += SYNTHETIC
    return [*argv, *extra]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch directory with ``configs/`` and the input files the snippets name."""
    root = tmp_path_factory.mktemp("docs")
    (root / "configs").symlink_to(ROOT / "configs")
    rows = SyntheticClickModel(SyntheticConfig(seed=1, cardinality_scale=0.0002)).rows(
        "train", 0, 1500
    )
    write_criteo_tsv(root / "criteo_train.txt", rows)
    rng = np.random.default_rng(3)
    for name, n in (("clicks.parquet", 1500), ("new_clicks.parquet", 200)):
        user, item, shop = rng.integers(0, 40, n), rng.integers(0, 30, n), rng.integers(0, 9, n)
        table = {"clicked": (rng.random(n) < 0.3).astype(int), "price": rng.gamma(2.0, 3.0, n),
                 "age": rng.integers(18, 70, n), "user": [f"u{u}" for u in user],
                 "item": [f"i{i}" for i in item], "shop": [f"s{s}" for s in shop]}  # fmt: skip
        pq.write_table(pa.table(table), root / name)
        if name == "clicks.parquet":
            pacsv.write_csv(pa.table(table).select(["clicked", "price", "user", "item"]),
                            root / "clicks.csv")  # fmt: skip
    views = {"user_id": [f"u{u}" for u in range(40) for _ in range(8)],
             "item_id": [f"sku{(u * 8 + t) % 120}" for u in range(40) for t in range(8)],
             "device": ["ios", "web"] * 160, "rating": [5, 4, 2, 5] * 80,
             "ts": list(range(320))}  # fmt: skip
    views["brand"] = [f"b{int(i[3:]) % 4}" for i in views["item_id"]]
    pq.write_table(pa.table(views), root / "views.parquet")
    users = {"user_id": ["u1", "u2", "new"], "device": ["ios", "web", "ios"],
             "seen": [["sku3", "sku4"], [], None]}  # fmt: skip
    pq.write_table(pa.table(users), root / "users.parquet")
    return root


@pytest.mark.parametrize(("language", "code"), [s[1:] for s in snippets()],
                         ids=[s[0] for s in snippets()])  # fmt: skip
def test_snippet_runs(language: str, code: str, workspace: Path, monkeypatch) -> None:
    monkeypatch.chdir(workspace)
    if language == "text":
        return
    if language == "python":
        for text, tiny in TINY.items():
            code = code.replace(text, tiny)
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})  # noqa: S102
    elif language == "yaml":
        fragment = workspace / "fragment.yaml"
        fragment.write_text(code)
        base = "configs/pretrain/mfp.yaml" if "objectives" in code else "configs/ctr/synthetic.yaml"
        cli = instantiate(["--config", base, "--config", str(fragment), *SYNTHETIC, *QUICK])
        assert cli.model is not None
    elif language == "bash":
        for argv in commands(code):
            _run_command(argv, workspace)
    else:
        pytest.fail(f"snippet of unknown language {language!r}")


def _launches_processes(argv: list[str]) -> bool:
    """Whether an ``ssl-rec`` command asks Lightning for more than one device."""
    for i, arg in enumerate(argv):
        value = arg.partition("=")[2] if arg.startswith("--trainer.devices=") else None
        if arg == "--trainer.devices" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None and value not in ("1", "auto"):
            return True
    return False


def _run_command(argv: list[str], workspace: Path) -> None:
    if argv[0] == "make":
        subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, check=True, capture_output=True)
    elif argv[0] == "ssl-rec" and _launches_processes(argv):
        # Lightning's launcher would start copies of this pytest process:
        # tests/distributed/test_lightning_launch.py runs the command in its own processes.
        assert (ROOT / "tests/distributed/test_lightning_launch.py").is_file()
    elif argv[0] == "ssl-rec":
        run(tiny_ssl_rec(argv[1:]))
    elif argv[0] == "python":
        if argv[1].startswith("benchmarks/"):  # quick, and its JSON into the scratch directory
            argv = [a if not a.endswith(".json") else str(workspace / Path(a).name) for a in argv]
            argv.append("--quick")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, check=True, env=env,
                             capture_output=True, text=True)  # fmt: skip
        assert out.stdout.strip()
    elif argv[0] in MULTI_PROCESS:
        # 2-process launches: tests/distributed/test_multiprocess.py runs them under torchrun.
        assert (ROOT / "tests/distributed/test_multiprocess.py").is_file()
    else:
        pytest.fail(f"snippet command {argv[0]!r} has no runner in tests/test_docs.py")
