"""What a LoRA costs a disk-resident UNet per use: sdplan merges ``immediately`` on every load
(no merged copy is cached); ``at_runtime`` keeps the LoRA's tensors resident and adds the
low-rank product in each step. Measured in one script on the demo model with its ``outline``
LoRA (or the tiny SD1 fixture with its kohya LoRA when the demo LoRA is absent), the UNet
read from disk (``--params-backend diffusion=disk``), 20 Euler steps at the model's size.

Reported per configuration: seconds of one UNet session's weight load (the reference:
``load`` without LoRA), of one picture, and the ratios to the plain run. Best of ``--repeat``.

Usage: ``python bench/bench_lora.py [--threads 2] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from sdplan.core.pipelines.demo.model import demo_lora_dir, demo_model_path
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.pipelines.stages.lora import prompt_loras
    from sdplan.core.runtime.runner import ModulePlacement

    lora_dir = demo_lora_dir()
    if (lora_dir / "outline.safetensors").is_file():
        model, tag, size, kw = demo_model_path(), "<lora:outline:1>", 128, {}
        prompt = "a yellow square on a blue background"
    else:
        lora_dir = REPO / "tests/fixtures"
        model, tag, size, kw = lora_dir / "sd1_tiny.safetensors", "<lora:lora_sd1_kohya:1>", 64, {"clip_heads": 2}
        prompt = "a photo of a cat"
    disk = {"diffusion": ModulePlacement(("CPU",), params_mode="disk")}
    out: dict[str, dict[str, float]] = {}
    with StableDiffusion(model, placements=disk, n_threads=args.threads, **kw) as sd:
        p = GenerateParams(prompt, "", size, size, 20, 5.0, 1, "euler", "discrete")
        unet = sd.runners["diffusion"]
        for mode in ("none", "immediately", "at_runtime"):
            text, loras = prompt_loras(prompt + tag, lora_dir, sd.lora_aliases())
            sd.set_loras([] if mode == "none" else loras, "immediately" if mode == "none" else mode)
            loads, pictures = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                with unet.session():  # disk residency: read (and merge) the UNet's weights
                    pass
                loads.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                sd.txt2img(dataclasses.replace(p, prompt=text))
                pictures.append(time.perf_counter() - t0)
            out[mode] = {"load_s": min(loads), "picture_s": min(pictures)}
    base = out["none"]
    for r in out.values():
        r["load_ratio"] = r["load_s"] / base["load_s"]
        r["picture_ratio"] = r["picture_s"] / base["picture_s"]
    print(json.dumps({"model": Path(model).name, "lora": tag, "threads": args.threads, **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
