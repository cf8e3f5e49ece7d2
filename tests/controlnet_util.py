"""A ControlNet for any UNet model file of the tests, made as diffusers'
``ControlNetModel.from_unet`` makes one: the UNet's encoder half (time embedding, SDXL's
``label_emb``, input blocks, middle block) copied, a seeded hint encoder and seeded (not zero)
zero convolutions, in the original layout under ``control_model.``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The hint encoder's widths (diffusers' ``conditioning_embedding_out_channels``) and strides.
HINT = ((3, 16, 1), (16, 16, 1), (16, 32, 2), (32, 32, 1), (32, 96, 2), (96, 96, 1), (96, 256, 2))


def controlnet_from_unet(model: str | Path, out: Path, seed: int = 5, scale: float = 1.0) -> str:
    """Write ``out``: the ControlNet of the UNet in ``model`` (an LDM single file or a
    standalone UNet file), its zero convolutions of gain ``scale``; returns its path."""
    from safetensors.numpy import load_file, save_file

    t = load_file(str(model))
    prefix = next(p for p in ("model.diffusion_model.", "") if p + "input_blocks.0.0.weight" in t)
    rng = np.random.default_rng(seed)
    cn: dict[str, np.ndarray] = {}
    for name, value in t.items():
        if not name.startswith(prefix):
            continue
        local = name[len(prefix):]
        if local.startswith(("time_embed.", "label_emb.", "input_blocks.", "middle_block.")):
            cn["control_model." + local] = value
    mc = t[prefix + "input_blocks.0.0.weight"].shape[0]
    dt = t[prefix + "input_blocks.0.0.weight"].dtype

    def conv(cin: int, cout: int, k: int, std: float) -> tuple[np.ndarray, np.ndarray]:
        return ((rng.standard_normal((cout, cin, k, k)) * std).astype(dt),
                (rng.standard_normal(cout) * std).astype(dt))

    for i, (cin, cout, _) in enumerate((*HINT, (256, mc, 1))):  # He-scaled: activations stay O(1)
        cn[f"control_model.input_hint_block.{2 * i}.weight"], cn[f"control_model.input_hint_block.{2 * i}.bias"] = \
            conv(cin, cout, 3, (2.0 / (cin * 9)) ** 0.5)
    blocks = sorted({int(n.split(".")[2]) for n in cn if n.startswith("control_model.input_blocks.")})
    for b in blocks:
        if f"control_model.input_blocks.{b}.0.op.weight" in cn:
            ch = cn[f"control_model.input_blocks.{b}.0.op.weight"].shape[0]
        elif b == 0:
            ch = mc
        else:
            ch = cn[f"control_model.input_blocks.{b}.0.out_layers.3.weight"].shape[0]
        cn[f"control_model.zero_convs.{b}.0.weight"], cn[f"control_model.zero_convs.{b}.0.bias"] = \
            conv(ch, ch, 1, scale / ch ** 0.5)
    mid = cn["control_model.middle_block.2.out_layers.3.weight"].shape[0] if \
        "control_model.middle_block.2.out_layers.3.weight" in cn else ch
    cn["control_model.middle_block_out.0.weight"], cn["control_model.middle_block_out.0.bias"] = \
        conv(mid, mid, 1, scale / mid ** 0.5)
    save_file(cn, str(out))
    return str(out)
