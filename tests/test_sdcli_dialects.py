"""Targets and dialects (spec section 14): a plan is for sdplan's engine or for sd-cli in the
``snapshot`` or ``newest`` dialect, named with ``--sdcli-dialect`` or read from an sd-cli
binary's ``--help``; ``--auto-fit`` is read in both spellings and written as the dialect
wants; every flag written exists in the target's dialect."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.commands import options
from sdplan.core.errors import PlanError
from sdplan.core.planning.placement import Placement, scan_placement_args
from sdplan.core.planning.sdcli import import_sdcli_command, parse_sdcli_args, sdcli_argv
from sdplan.core.planning.sdcli_table import SDCLI_OPTIONS, option
from sdplan.core.planning.sdcli_write import placement_argv, unwritable
from sdplan.core.planning.target import (
    Target,
    dialect_from_help,
    dialect_of_args,
    flag_in_dialect,
)

INV = {"devices": [
    {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 8 << 30, "total": 8 << 30},
    {"name": "CUDA1", "type": "gpu", "registry": "CUDA", "free": 24 << 30, "total": 24 << 30},
    {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 << 30, "total": 64 << 30}]}

NEWEST_HELP = """usage: sd-cli [options]
  --auto-fit <string>            automatic placement: on|off (default: on)
  --disable-segmented-compute    force monolithic graph execution
  --max-vram <string>            per-device budget
"""
SNAPSHOT_HELP = """usage: sd-cli [options]
  --stream-layers                stream offloaded layers to the device
  --auto-fit                     choose --backend/--params-backend automatically
"""


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_dialect_from_help_text() -> None:
    assert dialect_from_help(NEWEST_HELP) == "newest"
    assert dialect_from_help(SNAPSHOT_HELP) == "snapshot"
    # the segmented-compute switch alone says newest; --stream-layers beside it does not
    # make it the snapshot
    assert dialect_from_help("  --stream-layers\n  --disable-segmented-compute\n") == "newest"
    assert dialect_from_help("  --auto-fit [on|off]\n") == "newest"
    assert dialect_from_help("usage: something else\n") is None


def test_dialect_of_a_commands_own_syntax() -> None:
    assert dialect_of_args(["-m", "x", "--auto-fit", "on"]) == "newest"
    assert dialect_of_args(["-m", "x", "--auto-fit=OFF"]) == "newest"
    assert dialect_of_args(["-m", "x", "--auto-fit", "-p", "cat"]) == "snapshot"
    assert dialect_of_args(["--stream-layers"]) == "snapshot"
    assert dialect_of_args(["--backend", "diffusion=cuda0,cfg=cuda1"]) == "newest"
    # the snapshot takes WxH tile sizes too (in latent pixels): no sign either way
    assert dialect_of_args(["--vae-tile-size", "32x32"]) is None
    assert dialect_of_args(["--disable-prefetch", "--stream-layers"]) == "newest"
    assert dialect_of_args(["-p", "cat"]) is None


def test_flags_of_each_dialect() -> None:
    assert flag_in_dialect("--stream-layers", "snapshot")
    assert not flag_in_dialect("--stream-layers", "newest")
    for flag in ("--disable-prefetch", "--disable-segmented-compute", "--split-ratio",
                 "--tokenizer"):
        assert flag_in_dialect(flag, "newest") and not flag_in_dialect(flag, "snapshot")
        assert option(flag) is not None  # the reader knows them
    assert flag_in_dialect("--backend", "snapshot") and flag_in_dialect("--backend", "newest")
    longs = [o.long for o in SDCLI_OPTIONS]
    assert len(longs) == len(set(longs))


@pytest.mark.parametrize(("args", "mode", "rest"), [
    (["--auto-fit", "on", "-p", "cat"], "on", ["-p", "cat"]),
    (["--auto-fit", "OFF", "-p", "cat"], "off", ["-p", "cat"]),
    (["--auto-fit", "-p", "cat"], "switch", ["-p", "cat"]),
    (["--auto-fit", "cat"], "switch", ["cat"]),  # a following word that is not on/off
    (["--auto-fit=on"], "on", []),
    (["--auto-fit", "off", "--auto-fit"], "switch", []),  # the last one wins
    (["--auto-fit", "--auto-fit", "off"], "off", []),
    (["-p", "cat"], None, ["-p", "cat"]),
])
def test_auto_fit_is_read_in_both_spellings(args: list[str], mode: str | None,
                                            rest: list[str]) -> None:
    placement, left = scan_placement_args(args)
    assert placement.auto_fit_mode == mode and left == rest
    assert placement.auto_fit == (mode in ("on", "switch"))


def test_a_pasted_auto_fit_off_never_becomes_on() -> None:
    # the command: --auto-fit off kept the user's --backend and never became on
    imp = import_sdcli_command('sd-cli --auto-fit off --backend "diffusion=cuda0&cuda1" '
                               "--prompt cat")
    assert imp.placement.auto_fit_mode == "off" and not imp.placement.auto_fit
    assert imp.placement.to_strings()["backend"] == "diffusion=cuda0&cuda1"
    assert imp.generation == {"prompt": "cat"} and imp.kept == [] and imp.unknown == []
    assert imp.dialect == "newest"
    written = sdcli_argv(imp.placement, imp.model_files, imp.generation, imp.extra_args(),
                         dialect="newest")
    assert written == ["--backend", "diffusion=cuda0&cuda1", "--auto-fit", "off",
                       "--prompt", "cat"]
    # as held, the word comes back too
    assert sdcli_argv(imp.placement, {}, {}) == ["--backend", "diffusion=cuda0&cuda1",
                                                 "--auto-fit", "off"]
    args = parse_sdcli_args(["--auto-fit", "on", "-p", "x", "--auto-fit"])
    assert [(a.flag, a.values) for a in args] == [("--auto-fit", ("on",)), ("--prompt", ("x",)),
                                                 ("--auto-fit", ())]
    with pytest.raises(PlanError, match="on or off"):
        parse_sdcli_args(["--auto-fit=maybe"])


@pytest.mark.parametrize(("mode", "snapshot", "newest", "held"), [
    ("switch", ["--auto-fit"], ["--auto-fit", "on"], ["--auto-fit"]),
    ("on", ["--auto-fit"], ["--auto-fit", "on"], ["--auto-fit", "on"]),
    ("off", [], ["--auto-fit", "off"], ["--auto-fit", "off"]),
    (None, [], [], []),
])
def test_auto_fit_is_written_as_the_dialect_wants(mode, snapshot, newest, held) -> None:
    pl = Placement().with_auto_fit_mode(mode)
    assert placement_argv(pl, "snapshot") == snapshot
    assert placement_argv(pl, "newest") == newest
    assert placement_argv(pl) == held


def test_every_flag_written_exists_in_the_targets_dialect() -> None:
    pl = Placement.from_strings("CUDA0,diffusion=CUDA0&CUDA1,cfg=CUDA1", "te=disk", "CUDA0=6",
                                stream_layers=True, auto_fit="on", split_ratio="3,1",
                                disable_prefetch=True, disable_segmented_compute=True)
    for dialect in ("snapshot", "newest"):
        argv = placement_argv(pl, dialect)
        flags = [a for a in argv if a.startswith("--")]
        assert all(flag_in_dialect(f, dialect) for f in flags), (dialect, flags)
    assert placement_argv(pl, "newest") == [
        "--backend", "CUDA0,diffusion=CUDA0&CUDA1,cfg=CUDA1", "--params-backend", "te=disk",
        "--split-ratio", "3,1", "--max-vram", "CUDA0=6", "--auto-fit", "on",
        "--disable-prefetch", "--disable-segmented-compute"]
    assert placement_argv(pl, "snapshot") == [
        "--backend", "CUDA0,diffusion=CUDA0&CUDA1", "--params-backend", "te=disk",
        "--max-vram", "CUDA0=6", "--stream-layers", "--auto-fit"]
    assert unwritable(pl, "snapshot") == ["--backend cfg= (parallel CFG)", "--split-ratio",
                                          "--disable-prefetch", "--disable-segmented-compute"]
    assert unwritable(pl, "newest") == [
        "--stream-layers (the newest sd-cli streams offloaded weights by itself)"]


def test_target_from_the_help_of_an_sd_cli_binary(tmp_path: Path) -> None:
    class Args:
        sdcli_dialect = None
        sdcli_path = ""

    args = Args()
    args.sdcli_path = _script(tmp_path, "new", f"print({NEWEST_HELP!r})")
    assert options.target_from_args(args) == Target("sd-cli", "newest", True,
                                                    f"{args.sdcli_path} --help")
    args.sdcli_path = _script(tmp_path, "old", f"import sys; sys.stderr.write({SNAPSHOT_HELP!r})")
    assert options.target_from_args(args).dialect == "snapshot"
    args.sdcli_path = _script(tmp_path, "other", "print('hello')")
    got = options.target_from_args(args)
    assert (got.engine, got.dialect, got.known) == ("sd-cli", "newest", False)
    args.sdcli_dialect = "snapshot"  # a named dialect wins and the binary is not run
    args.sdcli_path = str(tmp_path / "missing")
    assert options.target_from_args(args) == Target("sd-cli", "snapshot", True,
                                                    "--sdcli-dialect")
    # a pasted command's syntax, else newest assumed; no flag and no command: the engine
    args.sdcli_dialect, args.sdcli_path = None, None
    assert options.target_from_args(args, "snapshot", pasted=True).dialect == "snapshot"
    assert options.target_from_args(args, None, pasted=True) == Target("sd-cli")
    assert options.target_from_args(args) == Target()


def test_an_sd_cli_binary_that_cannot_run_is_one_line(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps(INV))
    code = cli.main(["plan", "--devices", str(inv), "--sdcli", str(tmp_path / "nope"),
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "--sdcli" in out["error"]["message"]
    assert "no such program" in out["error"]["message"]
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    os.chmod(plain, 0o644)
    assert cli.main(["plan", "--devices", str(inv), "--sdcli", str(plain)]) == 2
    assert "not executable" in capsys.readouterr().err


def test_help_that_hangs_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdplan.core.errors import InvalidArgument

    monkeypatch.setattr(options, "HELP_TIMEOUT_S", 0.5)
    slow = _script(tmp_path, "slow", "import time; time.sleep(30)")
    with pytest.raises(InvalidArgument, match="did not finish within 0.5 s"):
        options.read_sdcli_help(slow)


def test_plan_json_names_its_target_and_writes_its_dialects_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps(INV))
    base = ["plan", "--devices", str(inv), "--backend", "diffusion=CUDA1", "--stream-layers",
            "--json"]
    assert cli.main(base) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"] == Target().to_json()
    assert cli.main([*base, "--sdcli-dialect", "snapshot"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["target"]["dialect"] == "snapshot" and snap["target"]["engine"] == "sd-cli"
    # written as given (no default was written, and sd-cli's own is the same device)
    assert snap["sdcli"]["flags"] == ["--backend", "diffusion=CUDA1", "--stream-layers"]
    assert cli.main([*base, "--sdcli-dialect", "newest"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert "--stream-layers" not in new["sdcli"]["flags"]
    assert "not_in_dialect" in [w["code"] for w in new["warnings"]]
    # argparse reads --auto-fit's words and refuses others in one line
    assert cli.main(["plan", "--devices", str(inv), "--auto-fit", "maybe"]) == 2
    err = capsys.readouterr().err
    assert "takes on or off, not 'maybe'" in err and err.count("\n") == 1
