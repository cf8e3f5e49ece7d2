"""The app's request path and the command line give the same picture and the same record.

For the demo model and for a DiT fixture (Chroma), the request the app builds
(:meth:`sdplan.core.session.session.Session.request`: the generation panel's settings, the open
model files and the board's resolved plan) runs through the engine job
(:func:`sdplan.core.pipelines.jobs.generate_job`, in this process) and is saved by the
panel's :meth:`~sdplan.app.generation.GenerationPanel.save_results`; ``sdplan generate
--in-process`` runs the same settings. The pixels are equal, and so are the ``sdplan`` text
chunk's fields: settings, placement, model flags, the sd-cli command, architecture, where each
module ran, model files and hash (the paths of the outputs aside), and sd-cli's
``parameters`` text. The demo's plan reads the VAE's weights from disk (set on the board,
``--params-backend vae=disk`` on the command line): the plan travels alike too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")
G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)

from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.core.pipelines.demo.model import DEMO_PROMPT, demo_model_path  # noqa: E402
from sdplan.core.pipelines.jobs import generate_job  # noqa: E402
from sdplan.core.runtime.devices import live_inventory  # noqa: E402
from sdplan.core.runtime.process import JobContext  # noqa: E402
from sdplan.core.runtime.runner import CancelToken  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures"
#: The ``sdplan`` chunk's fields both routes must write alike.
FIELDS = ("settings", "placement", "model_flags", "command", "architecture", "ran", "model_files",
          "model_hash", "model_hash_method", "version")

CASES = {
    "demo": {
        "files": {"model": [str(demo_model_path())]},
        "settings": {"prompt": DEMO_PROMPT, "negative_prompt": "a red circle", "width": 64, "height": 64,
                     "steps": 3, "cfg_scale": 5.0, "seed": 46, "sampling_method": "euler",
                     "scheduler": "discrete", "batch_count": 1},
        "extra": {"threads": 1},
        "board": lambda ctl: ctl.set_residency("vae", "disk"),
        "argv": ["--demo", "-p", DEMO_PROMPT, "-n", "a red circle", "-W", "64", "-H", "64", "--steps", "3",
                 "--cfg-scale", "5", "-s", "46", "--sampling-method", "euler", "--scheduler", "discrete",
                 "-t", "1", "--params-backend", "vae=disk"],
    },
    "chroma": {
        "files": {"diffusion_model": [str(FIX / "chroma_tiny.safetensors")], "t5xxl": [str(FIX / "t5_tiny.safetensors")],
                  "vae": [str(FIX / "flux_ae_tiny.safetensors")]},
        "settings": {"prompt": "a photo of a cat", "negative_prompt": None, "width": 64, "height": 64, "steps": 3,
                     "cfg_scale": 4.0, "seed": 5, "sampling_method": "euler_a", "scheduler": "karras",
                     "batch_count": 1},
        "extra": {"threads": 1, "overrides": {"flux_axes": [4, 6, 6], "t5_length": 16}},
        "board": lambda ctl: True,
        "argv": ["--diffusion-model", str(FIX / "chroma_tiny.safetensors"), "--t5xxl", str(FIX / "t5_tiny.safetensors"),
                 "--vae", str(FIX / "flux_ae_tiny.safetensors"), "--flux-axes", "4,6,6", "--t5-length", "16",
                 "-p", "a photo of a cat", "-W", "64", "-H", "64", "--steps", "3", "--cfg-scale", "4", "-s", "5",
                 "--sampling-method", "euler_a", "--scheduler", "karras", "-t", "1"],
    },
}


def record(path: Path) -> tuple[dict[str, Any], str]:
    text = Image.open(path).text
    return json.loads(text["sdplan"]), text["parameters"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_app_and_the_command_line_make_the_same_picture_and_record(case: str, qtbot, tmp_path: Path) -> None:
    c = CASES[case]
    ctl = PlanController(live_inventory())
    ctl.load_model_files(c["files"])
    assert c["board"](ctl)  # the plan on the board (the demo: the VAE's weights read from disk)
    panel = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: None)
    qtbot.addWidget(panel)
    req = ctl.session.request({**c["settings"], **c["extra"]})
    result = generate_job(JobContext(lambda *a: None, CancelToken()), req)
    [app_png] = panel.save_results(result["images"], result, req)

    cli_png = tmp_path / "cli.png"
    args = parse([*c["argv"], "-o", str(cli_png), "--in-process"])
    assert args.run(args) == 0

    assert np.array_equal(png(app_png), png(cli_png))
    app, app_params = record(app_png)
    cli, cli_params = record(cli_png)
    for key in FIELDS:
        assert app.get(key) == cli.get(key), (key, app.get(key), cli.get(key))
    assert app_params == cli_params
    assert app["settings"]["sampling_method"] == c["settings"]["sampling_method"]
    assert app["settings"]["scheduler"] == c["settings"]["scheduler"] and app["ran"]
    assert app["ran"]["vae"]["params"] == ("disk" if case == "demo" else "runtime")
