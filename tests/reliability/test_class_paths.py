"""Class paths read back from a checkpoint or quantized model directory never run code.

A tiny real checkpoint is trained once; hostile variants name ``os.system`` (with a command
that would create a marker file) in each place a config is rebuilt from. Every command and
Python loader refuses them in one line naming the class path, before anything is imported
or built; ``--allow_class`` / ``allow_classes`` let a user's own class through.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_outcome import error_line, refused

from ssl_rec.class_paths import UntrustedClassPath, allowed_classes, check_class_paths
from ssl_rec.cli import main
from ssl_rec.cli.allow_class_option import split_allow_option
from ssl_rec.lightning import CTRModule, PretrainModule, load_module
from ssl_rec.lightning.module_config import BackboneFactory, instantiate_config

USER_ENCODER = '''
from ssl_rec.models import DLRMEncoder


class UserEncoder(DLRMEncoder):
    """A user's own encoder (same weights as DLRM)."""
'''
IMPORT_SIDE_EFFECT = """
from pathlib import Path

Path({marker!r}).touch()


def make(*args, **kwargs):
    return None
"""


def _evil(marker: Path) -> dict[str, Any]:
    return {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("class_paths")


@pytest.fixture(scope="module")
def good_ckpt(work: Path) -> Path:
    """A 1-step CTR fit on tiny synthetic data: the checkpoint ``ssl-rec fit`` writes."""
    root = work / "run"
    main(["fit", "--config", "configs/ctr/synthetic.yaml", "--data.init_args.n_train=256",
          "--data.init_args.n_val=128", "--data.init_args.n_test=128",
          "--data.init_args.batch_size=128", "--data.init_args.synthetic.cardinality_scale=0.0002",
          f"--data.init_args.cache_dir={work / 'cache'}", "--trainer.fast_dev_run=1",
          "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          f"--trainer.default_root_dir={root}"])  # fmt: skip
    return next((root / "checkpoints").glob("*.ckpt"))


def _craft_encoder(hp: dict, dm: dict, evil: dict) -> None:
    hp["backbone"]["init_args"]["encoder"] = evil


def _craft_backbone(hp: dict, dm: dict, evil: dict) -> None:
    hp["backbone"] = evil


def _craft_module(hp: dict, dm: dict, evil: dict) -> None:
    hp["_class_path"] = "os.system"


def _craft_data(hp: dict, dm: dict, evil: dict) -> None:
    dm["_class_path"] = "os.system"
    dm["command"] = evil["init_args"]["command"]


def _craft_objective(hp: dict, dm: dict, evil: dict) -> None:
    """A pretraining checkpoint whose objective is the payload."""
    hp["_class_path"] = "ssl_rec.lightning.pretrain_module.PretrainModule"
    for key in ("head_hidden", "init_from", "finetune", "embedding_lr"):
        hp.pop(key)
    hp["objectives"] = {"mfp": evil}


def _craft_through_attribute(hp: dict, dm: dict, evil: dict) -> None:
    """Under ``ssl_rec.`` as a string, but resolving to ``os.system`` through an attribute."""
    hp["backbone"]["init_args"]["encoder"] = {**evil, "class_path": "ssl_rec.cli.main.os.system"}


CRAFTS: dict[str, tuple[Callable[[dict, dict, dict], None], str, str]] = {
    # name -> (change, key path in the message, class path in the message)
    "encoder": (_craft_encoder, "hyper_parameters.backbone.init_args.encoder.class_path",
                "'os.system'"),
    "backbone": (_craft_backbone, "hyper_parameters.backbone.class_path", "'os.system'"),
    "module": (_craft_module, "hyper_parameters._class_path", "'os.system'"),
    "datamodule": (_craft_data, "datamodule_hyper_parameters._class_path", "'os.system'"),
    "objective": (_craft_objective, "hyper_parameters.objectives.mfp.class_path", "'os.system'"),
    "through_attribute": (_craft_through_attribute,
                          "hyper_parameters.backbone.init_args.encoder.class_path",
                          "'ssl_rec.cli.main.os.system'"),
}  # fmt: skip


def _crafted(good: Path, out: Path, change: Callable[[dict, dict, dict], None]) -> Path:
    checkpoint = torch.load(good, map_location="cpu", weights_only=True)
    marker = out.with_suffix(".marker")
    change(checkpoint["hyper_parameters"], checkpoint["datamodule_hyper_parameters"], _evil(marker))
    torch.save(checkpoint, out)
    return out


@pytest.fixture(scope="module")
def hostile(good_ckpt: Path, work: Path) -> dict[str, Path]:
    """Every crafted variant of the good checkpoint, by name."""
    return {name: _crafted(good_ckpt, work / f"{name}.ckpt", change)
            for name, (change, _, _) in CRAFTS.items()}  # fmt: skip


def _marker(path: Path) -> Path:
    return path.with_suffix(".marker")


COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "test": lambda ckpt, t: ["test", "--ckpt_path", str(ckpt), "--trainer.logger=false",
                             f"--trainer.default_root_dir={t / 'test'}"],
    "validate": lambda ckpt, t: ["validate", "--ckpt_path", str(ckpt), "--trainer.logger=false",
                                 f"--trainer.default_root_dir={t / 'validate'}"],
    "predict": lambda ckpt, t: ["predict", "--ckpt_path", str(ckpt),
                                "--predictions.out", str(t / "p.parquet")],
    "export": lambda ckpt, t: ["export", "--ckpt_path", str(ckpt), "--out", str(t / "export")],
    "quantize": lambda ckpt, t: ["quantize", "--ckpt_path", str(ckpt), "--out", str(t / "q")],
    "evaluate-embeddings": lambda ckpt, t: ["evaluate-embeddings", "--ckpt_path", str(ckpt)],
    "explain": lambda ckpt, t: ["explain", "--ckpt_path", str(ckpt), "--candidate", str(t)],
    "monitor": lambda ckpt, t: ["monitor", "--ckpt_path", str(ckpt), "--candidate", str(t)],
    "fit --ckpt_path": lambda ckpt, t: [
        "fit", "--config", "configs/ctr/synthetic.yaml", "--ckpt_path", str(ckpt),
        f"--trainer.default_root_dir={t / 'resume'}", "--trainer.logger=false"],
    "fit --model.init_from": lambda ckpt, t: [
        "fit", "--config", "configs/ctr/synthetic.yaml", f"--model.init_args.init_from={ckpt}",
        f"--trainer.default_root_dir={t / 'finetune'}", "--trainer.logger=false"],
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_class_path_outside_the_allow_list(
    command: str, hostile: dict[str, Path], tmp_path: Path, capsys
) -> None:
    ckpt = hostile["encoder"]
    refused(COMMANDS[command](ckpt, tmp_path), capsys, str(ckpt), "'os.system'",
             "hyper_parameters.backbone.init_args.encoder", "--allow_class")  # fmt: skip
    assert not _marker(ckpt).exists()
    # refused before the command wrote anything: no output, run directory lock or config
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []


@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_test_command_refuses_each_place_a_config_is_rebuilt_from(
    craft: str, hostile: dict[str, Path], tmp_path: Path, capsys
) -> None:
    _, key, class_path = CRAFTS[craft]
    ckpt = hostile[craft]
    refused(COMMANDS["test"](ckpt, tmp_path), capsys, ckpt.name, key, class_path)
    assert not _marker(ckpt).exists()


@pytest.mark.parametrize("craft", sorted(CRAFTS))
@pytest.mark.parametrize(
    "loader",
    [load_module, CTRModule.load_from_checkpoint, PretrainModule.load_from_checkpoint],
    ids=["load_module", "CTRModule", "PretrainModule"],
)  # fmt: skip
def test_python_loaders_refuse_before_building(
    craft: str, loader: Callable[[Path], Any], hostile: dict[str, Path]
) -> None:
    _, key, class_path = CRAFTS[craft]
    with pytest.raises(UntrustedClassPath, match=key) as info:
        loader(hostile[craft])
    assert class_path in str(info.value) and "\n" not in str(info.value)
    assert not _marker(hostile[craft]).exists()


def test_allowing_os_system_still_builds_no_function(hostile: dict[str, Path]) -> None:
    """An allowed entry lets classes through, never a function such as ``os.system``."""
    with pytest.raises(UntrustedClassPath, match="not a class"):
        load_module(hostile["encoder"], allow_classes=["os.system"])
    assert not _marker(hostile["encoder"]).exists()


def test_a_checkpoint_ckpt_path_from_a_config_file_is_checked_too(
    hostile: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """``ckpt_path`` in a YAML reaches LightningCLI's own reading of the hyperparameters."""
    config = tmp_path / "test.yaml"
    config.write_text(f"ckpt_path: {hostile['encoder']}\n")
    refused(["test", "--config", "configs/ctr/synthetic.yaml", "--config", str(config),
              "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"],
             capsys, "'os.system'")  # fmt: skip
    assert not _marker(hostile["encoder"]).exists()


def test_the_console_script_prints_one_line_and_runs_nothing(hostile: dict[str, Path]) -> None:
    """What a user sees from the installed entry point, in a fresh process."""
    ckpt = hostile["encoder"]
    code = "from ssl_rec.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "test", "--ckpt_path", str(ckpt)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "'os.system'" in error_line(out.stderr)
    assert not _marker(ckpt).exists()


def test_a_dotted_string_for_a_callable_argument_is_never_imported(
    good_ckpt: Path, tmp_path: Path, monkeypatch
) -> None:
    """jsonargparse imports a string given for a ``Callable`` (the backbone's encoder)."""
    marker = tmp_path / "imported.marker"
    (tmp_path / "side_effect_mod.py").write_text(IMPORT_SIDE_EFFECT.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    change = lambda hp, dm, evil: hp["backbone"]["init_args"].update(  # noqa: E731
        encoder="side_effect_mod.make"
    )
    ckpt = _crafted(good_ckpt, tmp_path / "string.ckpt", change)
    with pytest.raises(UntrustedClassPath, match="backbone.init_args.encoder names"):
        load_module(ckpt)
    assert not marker.exists() and "side_effect_mod" not in sys.modules


def test_the_payload_is_live_when_the_user_gives_it(tmp_path: Path) -> None:
    """Control: the same config given by the user (not read from a file) is built as named,
    so the refusals above are what keeps the marker away."""
    marker = tmp_path / "control.marker"
    backbone = {"class_path": "ssl_rec.models.Backbone", "init_args": {"encoder": _evil(marker)}}
    instantiate_config(backbone, BackboneFactory, "control")
    assert marker.exists()


@pytest.fixture(scope="module")
def user_ckpt(good_ckpt: Path, work: Path) -> Path:
    """The good checkpoint with its encoder a user's own class (``user_encoders``)."""
    (work / "user_encoders.py").write_text(USER_ENCODER)
    change = lambda hp, dm, evil: hp["backbone"]["init_args"]["encoder"].update(  # noqa: E731
        class_path="user_encoders.UserEncoder"
    )
    return _crafted(good_ckpt, work / "user.ckpt", change)


def test_allow_classes_lets_a_users_class_through_in_python(
    user_ckpt: Path, work: Path, monkeypatch
) -> None:
    monkeypatch.syspath_prepend(str(work))
    with pytest.raises(UntrustedClassPath, match="'user_encoders.UserEncoder'"):
        load_module(user_ckpt)
    module = load_module(user_ckpt, allow_classes=["user_encoders"])
    assert type(module.backbone.encoder).__qualname__ == "UserEncoder"
    module = CTRModule.load_from_checkpoint(user_ckpt, allow_classes=["user_encoders.UserEncoder"])
    assert type(module.backbone.encoder).__qualname__ == "UserEncoder"
    with allowed_classes(["user_encoders"]):
        assert type(load_module(user_ckpt).backbone.encoder).__qualname__ == "UserEncoder"


def test_allow_class_option_lets_a_users_class_through_the_command_line(
    user_ckpt: Path, work: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.syspath_prepend(str(work))
    argv = COMMANDS["export"](user_ckpt, tmp_path)
    refused(argv, capsys, "'user_encoders.UserEncoder'", "--allow_class")
    main([*argv, "--allow_class", "user_encoders"])
    assert (tmp_path / "export").is_dir()
    main([*COMMANDS["test"](user_ckpt, tmp_path), "--allow_class=user_encoders"])
    assert "test_auc" in json.loads((tmp_path / "test" / "metrics.json").read_text())


def test_a_normal_checkpoint_still_loads_and_tests(
    good_ckpt: Path, tmp_path: Path, capsys
) -> None:  # fmt: skip
    assert isinstance(load_module(good_ckpt), CTRModule)
    assert isinstance(CTRModule.load_from_checkpoint(good_ckpt), CTRModule)
    main(COMMANDS["test"](good_ckpt, tmp_path))
    assert "test_auc" in json.loads((tmp_path / "test" / "metrics.json").read_text())


@pytest.fixture(scope="module")
def quantized_dir(good_ckpt: Path, work: Path) -> Path:
    """An FP32 'quantized' model directory of the good checkpoint (no search: cheap)."""
    from ssl_rec.lightning import read_checkpoint
    from ssl_rec.lightning.ctr_checkpoint import load_ctr
    from ssl_rec.quantize import ModelBuilder, save_quantized

    module, source = load_ctr(str(good_ckpt))
    model = ModelBuilder(source).build(source.fp32_plan())
    data = read_checkpoint(good_ckpt)["datamodule_hyper_parameters"]
    extra = {"source": {"checkpoint": str(good_ckpt)}, "data": data}
    return save_quantized(model, work / "quantized", {"budget_ne": 0.001}, extra,
                          vocabularies=module.vocabulary)  # fmt: skip


def _hostile_quantized(quantized: Path, out: Path, key: str) -> Path:
    import shutil

    shutil.copytree(quantized, out)
    manifest = json.loads((out / "manifest.json").read_text())
    if key == "encoder":
        manifest["architecture"]["encoder"] = _evil(_marker(out))
    else:
        manifest["data"] = {"_class_path": "os.system", "command": f"touch {_marker(out)}"}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize(
    ("key", "path"),
    [("encoder", "architecture.encoder.class_path"), ("data", "data._class_path")],
)  # fmt: skip
def test_a_quantized_directory_naming_os_system_is_refused(
    key: str, path: str, quantized_dir: Path, tmp_path: Path, capsys
) -> None:
    from ssl_rec.quantize import load_quantized

    directory = _hostile_quantized(quantized_dir, tmp_path / "q", key)
    with pytest.raises(UntrustedClassPath, match=path):
        load_quantized(directory)
    refused(["predict", "--ckpt_path", str(directory), "--out", str(tmp_path / "p.csv")],
             capsys, "manifest.json", path, "'os.system'")  # fmt: skip
    assert not _marker(directory).exists()


def test_an_architecture_built_in_python_checks_its_encoder(tmp_path: Path) -> None:
    from ssl_rec.quantize import Architecture
    from ssl_rec.schema import CategoricalField, FeatureSchema

    schema = FeatureSchema(["I1"], [CategoricalField("C1", 3)], "label")
    with pytest.raises(UntrustedClassPath, match="encoder.class_path names 'os.system'"):
        Architecture(4, _evil(tmp_path / "m"), []).build(schema)
    assert not (tmp_path / "m").exists()
    dlrm = {"class_path": "ssl_rec.models.DLRMEncoder", "init_args": {"top": [4]}}
    assert Architecture(4, dlrm, []).build(schema) is not None


def test_allow_class_option_is_taken_out_of_the_command_line() -> None:
    argv = ["test", "--allow_class", "a.b", "--ckpt_path", "x", "--allow_class=c,d.E"]
    assert split_allow_option(argv) == (["test", "--ckpt_path", "x"], ["a.b", "c", "d.E"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--allow_class"], "--allow_class needs a value"), (["--allow_class=a b"], "'a b'")],
)  # fmt: skip
def test_a_bad_allow_class_is_a_one_line_error(argv: list[str], expected: str, capsys) -> None:
    refused(["export", *argv], capsys, expected)


def test_an_allowed_prefix_is_a_package_boundary(tmp_path: Path) -> None:
    """``ssl_rec`` allows ``ssl_rec.models.X``, not ``ssl_recevil.X``; a user entry likewise."""
    config = {"class_path": "ssl_recevil.X"}
    with pytest.raises(UntrustedClassPath, match="not an ssl-rec class"):
        check_class_paths(config, "f.ckpt")
    with allowed_classes(["my_pkg"]), pytest.raises(UntrustedClassPath):
        check_class_paths({"class_path": "my_pkgevil.X"}, "f.ckpt")


@pytest.mark.parametrize("command", ["test", "export", "quantize", "evaluate-embeddings"])
def test_help_names_the_allow_option(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "--allow_class" in capsys.readouterr().out
