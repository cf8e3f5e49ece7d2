"""``sdplan upscale``: upscale an image with an ESRGAN-family model on the planned device.

``sdplan upscale -i IN.png --upscale-model FILE [-o OUT.png] [--upscale-repeats N]
[placement flags]`` as sd-cli spells them. The ``upscaler`` module's runtime device,
residency (``--params-backend upscaler=disk`` or a device) and budget (``--max-vram``,
which sets the tile size) come from the resolved plan.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.planning.placement import add_placement_arguments, placement_from_namespace

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan upscale`` on the dispatcher's subparsers."""
    p = subparsers.add_parser(
        "upscale", help="upscale an image with an ESRGAN model",
        description="Upscale an image with an ESRGAN-family model (.safetensors, or .pth/.ckpt "
                    "read without running pickled code) on the device the placement gives "
                    "the upscaler module.")
    p.add_argument("-i", "--init-img", dest="input", required=True, metavar="IN.png",
                   help="the image to upscale")
    p.add_argument("--upscale-model", required=True, metavar="FILE", help="the upscaler model file")
    p.add_argument("-o", "--output", default="output.png", metavar="OUT.png",
                   help="where to write the result (default: output.png)")
    p.add_argument("--upscale-repeats", type=int, default=1, metavar="N",
                   help="run the upscaler N times (default: 1)")
    p.add_argument("--upscale-tile", type=int, default=None, metavar="PX",
                   help="tile size in input pixels (default: from --max-vram, else 256)")
    p.add_argument("-t", "--threads", type=int, default=0, metavar="N",
                   help="CPU threads (default: all cores)")
    add_placement_arguments(p)
    p.set_defaults(run=run)
    return p


def _read_image(path: Path) -> Any:
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except FileNotFoundError:
        raise ModelFileError(path, "no such image") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise ModelFileError(path, f"cannot read image: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Upscale and write the image; 0 on success, 2 on any sdplan error."""
    from sdplan.core.pipelines.upscale import Upscaler
    from sdplan.core.planning.plan import resolve
    from sdplan.core.runtime.devices import live_inventory
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement

    if args.upscale_repeats < 1:
        print("sdplan upscale: --upscale-repeats must be >= 1", file=sys.stderr)
        return 2
    if args.upscale_tile is not None and args.upscale_tile < 8:
        print("sdplan upscale: --upscale-tile must be >= 8", file=sys.stderr)
        return 2
    try:
        placement = placement_from_namespace(args)
        plan = resolve(placement, live_inventory(rpc_servers=list(placement.rpc_servers)))
        for w in plan.warnings:
            log.warning("%s: %s", w.code, w.message)
        mp = ModulePlacement.from_plan(plan, "upscaler")
        image = _read_image(Path(args.input))
        from sdplan.core.runtime.devices import BackendManager

        with BackendManager(cpu_threads=args.threads or None) as manager:
            up = Upscaler(args.upscale_model, placement=mp, pool=BackendPool(manager),
                          tile=args.upscale_tile, n_threads=args.threads)
            try:
                out = up.upscale_image(image, args.upscale_repeats)
            finally:
                up.close()
    except SdplanError as exc:
        print(f"sdplan upscale: {exc}", file=sys.stderr)
        return 2
    from PIL import Image

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(out).save(args.output)
    print(f"{args.output}: {out.shape[1]}x{out.shape[0]} (x{up.scale ** args.upscale_repeats}, "
          f"{mp.devices[0]}, weights {mp.params_mode})")
    return 0
