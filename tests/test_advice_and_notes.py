"""The command line's "What would fit" comes from the board's Auto plan search (the smallest
change that fits, or the plan with every module's weights in RAM); init pictures and masks of another shape get a
note saying what is done to them; ``gui --screenshot`` leaves no temporary folder behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rpc_util import sdplan_cmd
from sdplan.core.cli import main
from sdplan.core.pipelines.stages.img2img import picture_notes
from sdplan.core.planning.autoplan_review import offloaded, review_advice, review_auto_plan
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import Profile

GIB = 1 << 30
REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"

#: A 12 GiB GPU (10 free), 32 GiB of RAM and two 8 GiB RPC GPUs.
BOX = {"devices": [
    {"name": "CUDA0", "description": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 10 * GIB, "total": 12 * GIB},
    {"name": "CPU", "description": "CPU", "type": "cpu", "registry": "CPU", "free": 30 * GIB, "total": 32 * GIB},
    {"name": "RPC0", "description": "192.0.2.10:50052", "type": "gpu", "registry": "RPC", "free": 7 * GIB, "total": 8 * GIB},
    {"name": "RPC1", "description": "192.0.2.10:50052", "type": "gpu", "registry": "RPC", "free": 7 * GIB, "total": 8 * GIB}]}
#: A DiT of 10 blocks of 1 GiB (and 1 GiB outside them), a 24-block text encoder of 0.5 GiB
#: blocks, a VAE of 160 MiB.
PROFILE = {"modules": {"diffusion": {"blocks": [GIB] * 10, "other": GIB},
                       "te": {"blocks": [GIB // 2] * 24, "other": GIB // 4},
                       "vae": {"blocks": [], "other": 160 << 20}}}


@pytest.fixture()
def box_files(tmp_path: Path) -> tuple[Path, Path]:
    box, prof = tmp_path / "their-box.json", tmp_path / "model.profile.json"
    box.write_text(json.dumps(BOX))
    prof.write_text(json.dumps(PROFILE))
    return box, prof


def test_the_readme_example_advice_finds_a_plan_that_fits(box_files, capsys) -> None:
    """README example 2 (``--max-vram CUDA0=6``): the plan does not fit, and the advice is the
    board's Auto plan (the smallest change that fits under the budget), whose flags fit."""
    box, prof = box_files
    assert main(["plan", "--devices", str(box), "--profile", str(prof), "--max-vram", "CUDA0=6"]) == 0
    out = capsys.readouterr().out
    assert "Estimate: does not fit" in out and "no placement on these devices fits" not in out
    advice = [a.strip() for a in out[out.index("What would fit"):].splitlines()[1:] if a.strip()]
    use = next(a for a in advice if a.startswith("use: "))
    assert "weights on CPU" in " ".join(advice) and '--max-vram "CUDA0=6"' in use
    flags = [w.strip('"') for w in use.removeprefix("use: ").split(" ")]
    assert main(["plan", "--devices", str(box), "--profile", str(prof), *flags]) == 0
    assert "Estimate: fits" in capsys.readouterr().out


def test_the_board_and_the_command_line_share_the_search() -> None:
    inv = Inventory.from_json(BOX)
    prof = Profile.from_json(PROFILE)
    plan = resolve(["--backend", "CUDA0", "--max-vram", "CUDA0=6"], inv, prof)
    review = review_auto_plan(inv, prof, plan.placement, width=512, height=512)
    assert review.fit.fits and not review.worse
    assert review.fit.devices["CUDA0"].total <= 6 * GIB
    advice = review_advice(plan, prof, inv, width=512, height=512)
    s = review.proposal.placement.to_strings()
    assert advice[-1].startswith(f'use: --backend "{s["backend"]}"')
    # with no budget-sized change possible, every module's weights in RAM is the alternative
    off = offloaded(plan.placement, prof, inv)
    fit = estimate_plan(resolve(off, inv, prof), prof, inv, width=512, height=512)
    assert fit.fits and round(fit.devices["CUDA0"].total / GIB, 2) == 5.81


def test_picture_notes_say_what_is_done() -> None:
    assert picture_notes((64, 64), None, 64, 64) == []
    assert picture_notes((128, 128), (128, 128), 64, 64) == []  # same shape: only resized
    assert picture_notes((1, 20000), None, 64, 64) == [
        "-i/--init-img is 1x20000 and is stretched to 64x64 (its aspect ratio 5e-05 becomes 1); "
        "crop it to that shape to keep its proportions"]
    assert picture_notes((64, 64), (96, 32), 64, 64) == [
        "--mask is 96x32, the init picture 64x64: the mask is stretched to 64x64, so it marks "
        "the same fractions of the picture, not the same pixels"]
    assert picture_notes((64, 64), (128, 128), 64, 64)[0].startswith(
        "--mask is 128x128, the init picture 64x64: the mask is resized to 64x64")


def test_generate_prints_the_picture_notes(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    tall = tmp_path / "tall.png"
    Image.fromarray(np.full((2000, 10, 3), 120, np.uint8)).save(tall)
    mask = tmp_path / "mask.png"
    Image.fromarray(np.full((32, 96), 255, np.uint8)).save(mask)
    out = tmp_path / "o.png"
    assert main(["generate", "-m", str(DEMO), "-p", "a red circle", "-W", "64", "-H", "64",
                 "--steps", "1", "-t", "1", "--in-process", "-i", str(tall), "--mask", str(mask),
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note: -i/--init-img is 10x2000 and is stretched to 64x64 (its aspect ratio 0.005 becomes 1)" in err
    assert "note: --mask is 96x32, the init picture 10x2000: the mask is stretched to 64x64" in err
    assert out.exists()


def test_gui_screenshot_leaves_no_temporary_folder(tmp_path: Path) -> None:
    pytest.importorskip("PySide6")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "QT_QPA_PLATFORM": "offscreen",
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "SDPLAN_CACHE_DIR": str(tmp_path / "cache")}
    for extra in ([], ["--tab", "gallery"]):
        shot = tmp_path / f"shot{len(extra)}.png"
        res = subprocess.run(sdplan_cmd("gui", "--screenshot", str(shot), "--size", "800x600", *extra),
                             capture_output=True, text=True, timeout=300, env=env,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr
        assert shot.stat().st_size > 0
        assert sorted(p.name for p in temp.iterdir()) == []
