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

from sdplan.core.errors import NonFiniteError, SdplanError
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


#: Output extensions ``-o`` accepts (Pillow writes each by its extension).
OUTPUT_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


def run(args: argparse.Namespace) -> int:
    """Upscale and write the image; 0 on success, 2 on any sdplan error. The flags, the
    input picture and the output location (never one of the inputs) are all checked before the
    model loads."""
    from sdplan.core.commands.messages import print_error
    from sdplan.core.commands.same_file import check_files
    from sdplan.core.modelfiles.readers import check_model_file
    from sdplan.core.pipelines.limits import check_upscale
    from sdplan.core.pipelines.stages.images import read_image_rgb
    from sdplan.core.pipelines.stages.outputs import check_output_file
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from sdplan.core.planning.plan import resolve
    from sdplan.core.runtime.devices import BackendManager, live_inventory
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement
    from sdplan.core.runtime.threads import choose_threads

    try:
        check_upscale(args)
        check_files([("-o/--output", args.output)],
                    [("-i/--init-img", args.input), ("--upscale-model", args.upscale_model)])
        image = read_image_rgb(Path(args.input))
        # x4 per repeat is the largest ESRGAN scale: an upper bound of the output's bytes
        side = 4 ** args.upscale_repeats
        check_input_size(image.shape[1], image.shape[0], side)
        check_output_file("-o/--output", args.output, OUTPUT_SUFFIXES,
                          needed_bytes=image.size * side * side)
        check_model_file(args.upscale_model)
        placement = placement_from_namespace(args)
        plan = resolve(placement, live_inventory(rpc_servers=list(placement.rpc_servers)))
        for w in plan.warnings:
            log.warning("%s: %s", w.code, w.message)
        mp = ModulePlacement.from_plan(plan, "upscaler")
        threads = choose_threads(args.threads)
        print(f"CPU threads: {threads.threads} ({threads.reason})", file=sys.stderr)
        with BackendManager(cpu_threads=threads.threads) as manager:
            up = Upscaler(args.upscale_model, placement=mp, pool=BackendPool(manager),
                          tile=args.upscale_tile, n_threads=threads.threads)
            try:
                out = up.upscale_image(image, args.upscale_repeats)
            except NonFiniteError as exc:  # name the likely cause: the upscaler's weights
                from sdplan.core.pipelines.finite import likely_causes

                raise exc.with_causes(likely_causes({"model_files": {"upscale_model": [args.upscale_model]}})) from None
            finally:
                up.close()
        path = _write(out, Path(args.output))
    except SdplanError as exc:
        print_error(exc)
        return 2
    print(f"{path}: {out.shape[1]}x{out.shape[0]} (x{up.scale ** args.upscale_repeats}, "
          f"{mp.devices[0]}, weights {mp.params_mode})")
    return 0


#: Largest output side (pixels) an upscale may produce: 4 GiB of RGB at most.
MAX_OUTPUT_SIDE = 32768


def check_input_size(width: int, height: int, scale: int) -> None:
    """Refuse an input whose upscaled side could exceed :data:`MAX_OUTPUT_SIDE` pixels
    (``scale``: the largest total factor); raises InvalidArgument naming the sizes."""
    from sdplan.core.errors import InvalidArgument

    if max(width, height) * scale > MAX_OUTPUT_SIDE:
        raise InvalidArgument(f"-i/--init-img is {width}x{height}: upscaled up to x{scale} it could "
                              f"reach {max(width, height) * scale} pixels a side, over the "
                              f"{MAX_OUTPUT_SIDE} limit; use a smaller picture or fewer "
                              "--upscale-repeats")


def _write(image: Any, path: Path) -> Path:
    """Write ``image`` atomically at ``path`` (format by extension); when that fails late,
    in the temporary folder, with a warning naming both. Raises OutputError when neither
    can be written."""
    import os
    import time

    from PIL import Image
    from sdplan.core.errors import OutputError
    from sdplan.core.pipelines.stages.outputs import atomic_write, fallback_folder

    pic = Image.fromarray(image)
    fmt = Image.registered_extensions().get(path.suffix.lower(), "PNG")
    try:
        return atomic_write(path, lambda tmp: pic.save(tmp, format=fmt))
    except OSError as exc:
        spare = fallback_folder() / f"sdplan-{os.getpid()}-{int(time.time())}-{path.name}"
        try:
            atomic_write(spare, lambda tmp: pic.save(tmp, format=fmt))
        except OSError as exc2:
            raise OutputError(f"-o/--output {str(path)!r}: cannot write it ({exc.strerror or exc}) "
                              f"nor {str(spare)!r} ({exc2.strerror or exc2}); the image is "
                              "lost") from None
        print(f"warning: cannot write {str(path)!r} ({exc.strerror or exc}); the image was "
              f"written to {str(spare)!r} instead", file=sys.stderr)
        return spare
