"""The built-in demo model: where it is and how it is meant to be run.

sdplan ships a small SD 1.x-layout model of its own (``sdplan.resources/demo``; how it was
made: ``resources/demo/README.md``). The command line's ``generate --demo`` and the app
take its file, size and sampling from here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.pipelines.demo.captions import parse_caption

#: The packaged demo model: ``sdplan.resources`` folder and file name.
DEMO_RESOURCE = ("demo", "sdplan-demo-shapes.safetensors")
#: The packaged demo LoRAs: ``sdplan.resources`` folder (``outline``: shapes drawn as outlines).
DEMO_LORA_DIR = ("demo", "loras")
#: Its generation defaults: size in pixels, steps and CFG scale.
DEMO_DEFAULTS: dict[str, int | float] = {"width": 128, "height": 128, "steps": 20, "cfg_scale": 5.0}
#: Its sampler and scheduler.
DEMO_SAMPLER = "euler"
DEMO_SCHEDULER = "discrete"
#: A caption it was trained on, offered first.
DEMO_PROMPT = "a yellow triangle on a green background"


def demo_model_path() -> Path:
    """The packaged demo model file.

    Raises:
        ModelFileError: this installation has no demo model file.
    """
    ref = resources.files("sdplan.resources").joinpath("/".join(DEMO_RESOURCE))
    path = Path(str(ref))
    if not path.is_file():
        raise ModelFileError(path, "the demo model (--demo) is not installed")
    return path


def demo_lora_dir() -> Path:
    """The folder of the demo model's LoRAs (it may be missing from an installation)."""
    return Path(str(resources.files("sdplan.resources").joinpath("/".join(DEMO_LORA_DIR))))


def demo_caption_known(prompt: str) -> bool:
    """Is ``prompt`` one of the demo model's 168 training captions (any case/spacing; LoRA
    tags aside)?"""
    from sdplan.core.text.lora_tags import extract_lora_tags

    try:
        parse_caption(extract_lora_tags(prompt)[0])
    except SdplanError:
        return False
    return True


def demo_generation() -> dict[str, object]:
    """The settings the app offers with the demo model: a trained caption, the demo's size,
    steps, CFG, sampler and scheduler, seed 42, one image."""
    return {"prompt": DEMO_PROMPT, "negative_prompt": None, **DEMO_DEFAULTS, "seed": 42,
            "sampling_method": DEMO_SAMPLER, "scheduler": DEMO_SCHEDULER, "batch_count": 1}
