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
    assert cmd["written"] == (
        f"./sd-cli --diffusion-model {shlex.quote(str(model))} --backend CUDA0,diffusion=CUDA1 "
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
