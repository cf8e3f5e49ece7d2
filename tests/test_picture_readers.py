"""Third-party readers read sdplan's pictures: sd-parsers and sd-prompt-reader find the prompt,
negative prompt, seed, steps, sampler, CFG and web UI's ``Model hash`` (the first 10 hex
digits of the model file's SHA-256), and no chunk holds a folder of the user's.

The readers are not sdplan dependencies (sd-prompt-reader does not declare its own
``piexif``): the test runs them with the Python named by ``SDPLAN_READERS_PYTHON``, an
environment made for them::

    python -m venv /tmp/readers && /tmp/readers/bin/pip install sd-parsers sd-prompt-reader piexif
    SDPLAN_READERS_PYTHON=/tmp/readers/bin/python pytest tests/test_picture_readers.py

and is skipped without it (``SDPLAN_REQUIRE_READERS=1`` makes that a failure)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.pipelines.stages.results import picture_text, read_png_text, save_png

READERS = textwrap.dedent("""
    import json, sys
    from sd_parsers import ParserManager
    from sd_prompt_reader.image_data_reader import ImageDataReader
    info = ParserManager().parse(sys.argv[1])
    s = info.samplers[0]
    r = ImageDataReader(sys.argv[1])
    print(json.dumps({
        "sd_parsers": {"generator": str(info.generator.value), "prompt": s.prompts[0].value,
                       "negative": s.negative_prompts[0].value, "sampler": s.name,
                       "seed": s.parameters.get("seed"), "steps": s.parameters.get("steps"),
                       "cfg": s.parameters.get("cfg_scale"), "model": s.model.name,
                       "hash": s.model.hash},
        "sd_prompt_reader": {"tool": r.tool, "prompt": r.positive, "negative": r.negative,
                             **{k: r.parameter.get(k) for k in ("sampler", "seed", "steps",
                                                                  "cfg", "model")},
                             "settings": r.setting}}))
""")


def _python() -> str:
    exe = os.environ.get("SDPLAN_READERS_PYTHON")
    if not exe:
        if os.environ.get("SDPLAN_REQUIRE_READERS") == "1":
            pytest.fail("SDPLAN_READERS_PYTHON is not set (a Python with sd-parsers and "
                        "sd-prompt-reader)")
        pytest.skip("SDPLAN_READERS_PYTHON names no Python with sd-parsers and sd-prompt-reader")
    return exe


def test_sd_parsers_and_sd_prompt_reader_read_a_picture(tmp_path: Path) -> None:
    exe = _python()
    models = tmp_path / "home" / "alice" / "models"
    models.mkdir(parents=True)
    model = models / "v1-5-pruned-emaonly.safetensors"
    model.write_bytes(np.random.default_rng(7).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes())
    record = {"params": {"prompt": "a lighthouse at dusk, (golden light:1.2)",
                         "negative_prompt": "fog, blurry", "steps": 23, "seed": 987654,
                         "cfg_scale": 6.5, "width": 512, "height": 768,
                         "sampling_method": "dpm++2m", "scheduler": "karras",
                         "init_img": str(tmp_path / "home" / "alice" / "start.png"),
                         "strength": 0.6},
              "plan": {"backend": "CUDA0,vae=CPU"}, "model_flags": []}
    pic = save_png(np.zeros((64, 64, 3), np.uint8), tmp_path / "pic.png",
                   picture_text(record, {"model": [str(model)]}))
    assert "alice" not in "".join(read_png_text(pic).values())
    out = subprocess.run([exe, "-c", READERS, str(pic)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    short = hashlib.sha256(model.read_bytes()).hexdigest()[:10]
    assert got["sd_parsers"] == {
        "generator": "AUTOMATIC1111", "prompt": "a lighthouse at dusk, (golden light:1.2)",
        "negative": "fog, blurry", "sampler": "dpm++2m karras", "seed": "987654",
        "steps": "23", "cfg": "6.500000", "model": "v1-5-pruned-emaonly.safetensors",
        "hash": short}
    spr = got["sd_prompt_reader"]
    assert {k: spr[k] for k in ("tool", "prompt", "negative", "sampler", "seed", "steps",
                                "cfg", "model")} == {
        "tool": "A1111 webUI", "prompt": "a lighthouse at dusk, (golden light:1.2)",
        "negative": "fog, blurry", "sampler": "dpm++2m karras", "seed": "987654",
        "steps": "23", "cfg": "6.500000", "model": "v1-5-pruned-emaonly.safetensors"}
    assert f"Model hash: {short}," in spr["settings"]  # what it shows of the hash
