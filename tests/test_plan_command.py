"""``sdplan plan --command "sd-cli ..."``: a whole pasted command is planned, and its JSON
carries the written command and the arguments sdplan keeps without understanding."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from sdplan.core import cli

FIX = Path(__file__).parent / "fixtures"
D1 = Path(__file__).resolve().parent.parent.parent / "shared" / "cases" / "devices" / "D1.json"


@pytest.mark.shared
def test_plan_command_json(shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = FIX / "flux_dev_tiny.safetensors"
    text = (f"./sd-cli --diffusion-model {shlex.quote(str(model))} -p 'a cat' -W 768 -H 512 "
            "--backend diffusion=cuda1 --diffusion-fa --cache-mode easycache --cfg-scale 1.0 "
            "--frobnicate 3")
    code = cli.main(["plan", "--devices", str(shared_dir / "cases/devices/D1.json"),
                     "--command", text, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["modules"]["diffusion"]["devices"] == ["CUDA1"]
    cmd = out["command"]
    assert cmd["kept"] == ["--diffusion-fa", "--cache-mode", "easycache"]
    assert cmd["unknown"] == ["--frobnicate", "3"]
    assert cmd["generation"] == {"prompt": "a cat", "width": 768, "height": 512,
                                 "cfg_scale": 1.0}
    # a pasted command is planned for sd-cli (its syntax shows no dialect: the newest), whose
    # auto-fit keeps the written --backend, so it is written back as pasted (exact names)
    assert out["target"] == {"engine": "sd-cli", "dialect": "newest", "known": False,
                             "source": "assumed"}
    assert cmd["written"] == (
        f"./sd-cli --diffusion-model {shlex.quote(str(model))} --backend diffusion=CUDA1 "
        "--prompt 'a cat' --width 768 --height 512 --cfg-scale 1.0 --diffusion-fa "
        "--cache-mode easycache --frobnicate 3")
    # the size of the command drives the estimate
    assert out["fit"]["width"] == 768 and out["fit"]["height"] == 512


@pytest.mark.shared
def test_plan_command_refuses_flags_given_twice(shared_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--devices", str(shared_dir / "cases/devices/D1.json"),
                     "--backend", "cpu", "--command", "sd-cli -m x.gguf", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["error"]["code"] == "conflicting_model_sources"
    assert "--backend" in out["error"]["message"]


@pytest.mark.shared
def test_plan_command_reports_a_bad_command(shared_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--devices", str(shared_dir / "cases/devices/D1.json"),
                     "--command", "sd-cli -p 'open", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["error"]["code"] == "invalid_assignment"


def test_runtime_flags_of_the_sd_cli_command_change_its_estimate() -> None:
    from sdplan.core.planning.estimate import (
        RuntimeFlags,
        estimate_plan,
        im2col_bytes,
        module_compute,
    )
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.modules import GIB
    from sdplan.core.planning.plan import resolve
    from sdplan.core.planning.profile import ModuleProfile, Profile
    from sdplan.core.planning.sdcli import import_sdcli_command

    inv = Inventory((Device("CUDA0", "A", "gpu", "CUDA", 24 * GIB, 24 * GIB),
                     Device("CPU", "cpu", "cpu", "CPU", 64 * GIB, 64 * GIB)))
    prof = Profile({"diffusion": ModuleProfile((), 2 * GIB), "te": ModuleProfile((), GIB // 4),
                    "vae": ModuleProfile((), GIB // 8)}, architecture="sd1")
    imp = import_sdcli_command("sd-cli -m m.safetensors -p x --backend te=cpu "
                               "--diffusion-fa --vae-conv-direct --mmap --eager-load")
    flags = imp.runtime_flags()
    assert flags == RuntimeFlags(frozenset({"diffusion"}), frozenset({"vae"}), True, True)
    plan = resolve(imp.placement, inv, prof)
    kw = {"width": 1024, "height": 1024, "batch": 1}
    plain = estimate_plan(plan, prof, inv, flags=RuntimeFlags(), **kw)
    fast = estimate_plan(plan, prof, inv, flags=flags, **kw)
    latent = 128 * 128
    # flash attention: SD1's first attention (8 heads, latent tokens) loses its score matrix
    assert plain.modules["diffusion"].compute["CUDA0"] - fast.modules["diffusion"].compute[
        "CUDA0"] == 4 * 8 * latent * latent
    # direct convolutions: the VAE's im2col buffer (F16, 3x3 over 128 channels at 1024^2)
    assert im2col_bytes("vae", "sd1", **kw) == 2 * 9 * 128 * 1024 * 1024
    assert plain.modules["vae"].compute["CUDA0"] - fast.modules["vae"].compute["CUDA0"] == \
        im2col_bytes("vae", "sd1", **kw)
    # --mmap: the text encoder's weights on the CPU are mapped pages, not allocations
    assert plain.modules["te"].weights == {"CPU": GIB // 4} and fast.modules["te"].weights == {}
    # sdplan's own engine (no flags) is estimated from its own graphs' figures, not sd-cli's
    own = estimate_plan(plan, prof, inv, **kw)
    assert own.engine == "sdplan" and fast.engine == "sd-cli"
    vae_own, source = module_compute("vae", prof.modules["vae"], "sd1", **kw)
    assert own.modules["vae"].compute["CUDA0"] == vae_own and source == "fitted"
    assert vae_own < plain.modules["vae"].compute["CUDA0"] - im2col_bytes("vae", "sd1", **kw)


def test_a_negative_number_list_reaches_its_flags_own_check(capsys: pytest.CaptureFixture[str]) -> None:
    """``--split-ratio -1,2`` is the ratio's error (argparse alone reads ``-1,2`` as an
    option and says only "expected one argument"); ``=`` and a single negative number are
    as before, and a word after a flag that takes no value is left alone."""
    assert cli.negative_values(cli.build_parser("plan"), ["plan", "--split-ratio", "-1,2", "-v", "-1,2"]) == [
        "plan", "--split-ratio=-1,2", "-v", "-1,2"]
    assert cli.negative_values(cli.build_parser("plan"), ["plan", "--max-vram", "-1,cpu=4"]) == [
        "plan", "--max-vram=-1,cpu=4"]
    assert cli.main(["plan", "--model-profile", "sd15-f16", "--split-ratio", "-1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error [invalid_split_ratio]: --split-ratio: '-1' is not a ratio (write auto, vram or "
                   "non-negative numbers such as 3,1) (at --split-ratio characters 1-2)"]
