"""Written commands run as planned on the newest sd-cli (spec section 14.2): explicit
``--params-backend`` entries or ``--auto-fit off`` where its auto-fit would choose otherwise,
never ``--stream-layers``; its switches, VAE tiling flags (14.7), new model-file flags and
module ``audio_encoder`` (14.8) read, kept and written."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli import import_sdcli_command
from sdplan.core.planning.sdcli_write import newest_placement, placement_argv, same_residency
from sdplan.core.planning.target import Target
from sdplan.core.planning.vae_tiling import VaeTiling, convert_tile_size, vae_scale_factor

NEWEST = Target("sd-cli", "newest", True, "test")
MODEL = shlex.quote(str(Path(__file__).parent / "fixtures" / "flux_dev_tiny.safetensors"))
INV = {"devices": [
    {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 12 << 30, "total": 12 << 30},
    {"name": "CUDA1", "type": "gpu", "registry": "CUDA", "free": 12 << 30, "total": 12 << 30},
    {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 << 30, "total": 64 << 30}]}
D = Inventory.from_json(INV)
# a 16 GiB DiT in 16 blocks, a 5 GiB encoder, a 0.25 GiB VAE
PROF = Profile({"diffusion": ModuleProfile((GIB,) * 16, 0), "te": ModuleProfile((), 5 * GIB),
                "vae": ModuleProfile((), GIB // 4)}, architecture="flux-dev")


def written_for_newest(args: list[str]) -> tuple[list[str], list[str]]:
    """Plan ``args`` for sdplan's engine, write them for the newest sd-cli, and check that
    the newest sd-cli's reading of what is written is the plan."""
    plan = resolve(Placement.from_args(args), D, PROF)
    placement, notes = newest_placement(plan, D, PROF)
    argv = placement_argv(placement, "newest")
    again = resolve(Placement.from_args(argv), D, PROF, NEWEST)
    assert same_residency(again, plan), (argv, {m: (again.modules[m].devices,
                                                    again.modules[m].params) for m in plan.modules})
    return argv, notes


def test_split_plan_gets_auto_fit_off() -> None:
    # diffusion over both GPUs, weights following runtime: the newest auto-fit counts 16 GiB
    # on each 11.5 GiB budget and would move them to RAM, so --auto-fit off is written
    argv, notes = written_for_newest(["--backend", "CUDA0,diffusion=CUDA0&CUDA1"])
    assert argv == ["--backend", "CUDA0,diffusion=CUDA0&CUDA1", "--auto-fit", "off"]
    assert notes and "--auto-fit off" in notes[0]
    # the flags alone, read by the newest sd-cli, are not the plan
    plan = resolve(Placement.from_strings("CUDA0,diffusion=CUDA0&CUDA1"), D, PROF)
    assert not same_residency(resolve(plan.placement, D, PROF, NEWEST), plan)


@pytest.mark.parametrize(("args", "want"), [
    (["--backend", "CUDA0", "--params-backend", "diffusion=disk"],  # disk plan
     ["--backend", "CUDA0", "--params-backend", "diffusion=disk"]),
    (["--backend", "CUDA1", "--offload-to-cpu"],  # RAM plan
     ["--backend", "CUDA1", "--params-backend", "CPU"]),
    (["--backend", "CUDA0,diffusion=CUDA0&CUDA1", "--params-backend", "te=cpu"],
     ["--backend", "CUDA0,diffusion=CUDA0&CUDA1", "--params-backend", "te=CPU"]),
])
def test_explicit_params_already_turn_auto_fit_off(args: list[str], want: list[str]) -> None:
    argv, notes = written_for_newest(args)
    assert argv == want and notes == []


def test_a_plan_auto_fit_would_choose_itself_is_written_as_is() -> None:
    # te and vae on CUDA1 with diffusion in RAM... a small model fits where it runs
    small = Profile({"diffusion": ModuleProfile((GIB,) * 4, 0), "te": ModuleProfile((), GIB)})
    plan = resolve(Placement.from_strings("CUDA1"), D, small)
    placement, notes = newest_placement(plan, D, small)
    assert placement_argv(placement, "newest") == ["--backend", "CUDA1"] and notes == []


def test_stream_layers_is_never_written_for_the_newest() -> None:
    argv, notes = written_for_newest(["--backend", "CUDA0", "--params-backend", "diffusion=cpu",
                                      "--max-vram", "CUDA0=6", "--stream-layers"])
    assert "--stream-layers" not in argv
    assert argv == ["--backend", "CUDA0", "--params-backend", "diffusion=CPU",
                    "--max-vram", "CUDA0=6"]
    assert any("--stream-layers" in n for n in notes)


def test_the_snapshot_auto_fit_choice_is_pinned_for_the_newest() -> None:
    # the bare switch shows section 13's choice; written for the newest sd-cli (whose
    # auto-fit would choose otherwise) it is pinned as explicit strings
    plan = resolve(Placement.from_args(["--auto-fit"]), D, PROF)
    assert plan.auto_fit is not None and plan.auto_fit.time_share
    placement, _ = newest_placement(plan, D, PROF)
    argv = placement_argv(placement, "newest")
    assert "--auto-fit" not in argv and "--params-backend" in argv
    assert same_residency(resolve(placement, D, PROF, NEWEST), plan)


def _plan(tmp_path: Path, capsys, *args: str) -> dict:  # noqa: ANN001
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps(INV))
    code = cli.main(["plan", "--devices", str(inv), *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    return out


def test_a_snapshot_command_written_for_the_newest(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    # the bare --auto-fit shows the command is the snapshot's; planned as it runs there
    # (section 13's choice), written for the newest with that choice pinned: tile
    # size 32 latent pixels -> 256 image pixels (8x VAE), no --auto-fit switch
    text = (f"sd-cli -m {MODEL} --auto-fit -p cat --vae-tiling --vae-tile-size 32 "
            "--vae-tile-overlap 0.25 --stream-layers")
    out = _plan(tmp_path, capsys, "--command", text, "--sdcli-dialect", "newest")
    cmd = out["command"]
    assert cmd["source_dialect"] == "snapshot" and cmd["dialect"] == "newest"
    # section 13 put the tiny diffusion model on CUDA0 (most room, first on a tie): pinned
    assert cmd["written"] == (f"sd-cli --model {MODEL} --backend CUDA0 --prompt cat "
                              "--vae-tiling --vae-tile-size 256 --vae-tile-overlap 0.25")
    assert cmd["vae_tiling"] == {"enabled": True, "tile_px": [256, 256], "overlap": 0.25,
                                 "relative": None}
    assert out["target"]["dialect"] == "snapshot"  # the plan is the command's meaning
    # and back: a newest command for the snapshot divides by the scale factor
    back = _plan(tmp_path, capsys, "--command", f"sd-cli -m {MODEL} --auto-fit on "
                 "--vae-tile-size 512x256 -p cat", "--sdcli-dialect", "snapshot")
    # (the newest auto-fit's choice, CUDA0 for everything, pinned for the snapshot)
    assert back["command"]["written"] == (f"sd-cli --model {MODEL} --backend CUDA0 --prompt cat "
                                          "--vae-tile-size 64x32")


def test_tile_size_of_unknown_units_is_flagged(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = _plan(tmp_path, capsys, "--command", f"sd-cli -m {MODEL} -p cat --vae-tiling "
                "--vae-tile-size 32x32")
    msgs = [w["message"] for w in out["warnings"] if w["code"] == "vae_tile_size_units"]
    assert len(msgs) == 1 and "32x32" in msgs[0]
    assert out["command"]["written"].endswith("--vae-tiling --vae-tile-size 32x32")
    named = _plan(tmp_path, capsys, "--command", f"sd-cli -m {MODEL} -p cat --vae-tile-size 32",
                  "--sdcli-dialect", "newest")
    assert "vae_tile_size_units" not in [w["code"] for w in named["warnings"]]


def test_bad_tiling_values_are_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps(INV))
    code = cli.main(["plan", "--devices", str(inv), "--command",
                     "sd-cli -m m.gguf --vae-tile-size 32y", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["error"]["code"] == "invalid_vae_tiling"
    assert "--vae-tile-size" in out["error"]["message"]


def test_vae_tiling_units() -> None:
    assert convert_tile_size("32", "snapshot", "newest", 8) == "256"
    assert convert_tile_size("32x16", "snapshot", "newest", 16) == "512x256"
    assert convert_tile_size("0", "snapshot", "newest", 8) == "0"
    assert convert_tile_size("100", "newest", "snapshot", 8) == "12"
    assert convert_tile_size("4", "newest", "snapshot", 8) == "1"
    assert vae_scale_factor("flux2_klein") == 16 and vae_scale_factor("sdxl") == 8
    # 1024x768 image, 8x VAE: latent 128x96; default 256 px -> 32 latent pixels
    assert VaeTiling(True).tile_latent(1024, 768, 8) == (32, 32)
    assert VaeTiling(True, (16, 300)).tile_latent(1024, 768, 8) == (4, 37)  # at least 4
    # 3 tiles per axis overlapping by half: 96 / (3 - 1.5 + 0.5) = 48 (sd-cli's get_tile_sizes)
    assert VaeTiling(True, relative=(0.5, 3.0)).tile_latent(1024, 768, 8) == (64, 48)


def test_switches_tiling_and_new_files_survive_writing(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    text = (f"sd-cli --diffusion-model {MODEL} --tokenizer tok.json "
            "--llm_vision v.safetensors --embeddings-connectors c.safetensors -p cat "
            "--disable-prefetch --vae-relative-tile-size 0.5x0.5 --vae-tiling "
            "--disable-segmented-compute --backend audio_encoder=cuda1")
    out = _plan(tmp_path, capsys, "--command", text)
    cmd = out["command"]
    assert cmd["module_files"] == {"te": {"--tokenizer": "tok.json",
                                          "--llm_vision": "v.safetensors",
                                          "--embeddings-connectors": "c.safetensors"}}
    assert out["modules"]["audio_encoder"]["devices"] == ["CUDA1"]
    assert cmd["written"] == (
        f"sd-cli --diffusion-model {MODEL} --backend audio_encoder=CUDA1 "
        "--disable-prefetch --disable-segmented-compute --prompt cat --tokenizer tok.json "
        "--llm_vision v.safetensors --embeddings-connectors c.safetensors "
        "--vae-relative-tile-size 0.5x0.5 --vae-tiling")
    again = import_sdcli_command(cmd["written"])
    assert again.placement.disable_prefetch and again.placement.disable_segmented_compute
    # the snapshot has none of the newest options: left out, each named
    snap = _plan(tmp_path, capsys, "--command", text, "--sdcli-dialect", "snapshot")
    written = shlex.split(snap["command"]["written"])
    for flag in ("--tokenizer", "--disable-prefetch", "--disable-segmented-compute"):
        assert flag not in written
    assert snap["command"]["left_out"] == ["--tokenizer", "tok.json"]
    assert "not_in_dialect" in [w["code"] for w in snap["warnings"]]


def test_audio_encoder_is_a_single_device_module() -> None:
    plan = resolve(Placement.from_strings("CUDA0,audio-encoder=CUDA0&CUDA1"), D)
    assert plan.modules["audio_encoder"].devices == ["CUDA0"]
    assert "split_not_supported" in plan.warning_codes()
    assert resolve(Placement.from_strings("audioencoder=cuda1"), D).backend == \
        "CUDA0,audio_encoder=CUDA1"
