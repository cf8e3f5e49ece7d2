"""ControlNet as sd-cli runs it with a UNet pipeline: the control picture, its Canny
preprocessor, and the residuals the UNet adds each step.

sd-cli (``src/stable-diffusion.cpp``'s ``sample`` and ``compute_sample_controls``; read, not
copied) runs the ControlNet once per step on the scaled latent ``x * c_in``, the step's
timestep and the *conditional* prompt's context (and vector), and adds its residuals, times
``--control-strength``, to both the conditional and the unconditional UNet passes. The
control picture is the generation's size, in [0, 1]; ``--canny`` first replaces it by sd-cli's
``preprocess_canny`` edges (``src/runtime/preprocessing.hpp``: grey, a 5x5 Gaussian of sigma
1.4, Sobel gradients, non-maximum suppression with sd-cli's direction tests, the double
threshold 0.08 / 0.08 with hysteresis, a 3-pixel border cleared), on every channel.

The ControlNet is the ``controlnet`` module: its own runner, placed as the plan says (device,
residency, budget), loaded with the pipeline, its weights in use for a whole sampling loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.controlnet import ControlNetGraph, controlnet_config, residual_shapes
from sdplan.core.runtime.weights import WeightFile

__all__ = ["canny", "control_picture", "ControlNetStage"]


def _correlate(img: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``img`` (H, W) correlated with ``k`` (kh, kw), zero outside (sd-cli's
    ``convolve_tensor``), float32."""
    kh, kw = k.shape
    ph, pw = kh // 2, kw // 2
    pad = np.pad(img, ((ph, ph), (pw, pw)))
    out = np.zeros_like(img, dtype=np.float32)
    for dy in range(kh):
        for dx in range(kw):
            out += np.float32(k[dy, dx]) * pad[dy:dy + img.shape[0], dx:dx + img.shape[1]]
    return out


def canny(rgb: np.ndarray, high: float = 0.08, low: float = 0.08, weak: float = 0.8,
          strong: float = 1.0) -> np.ndarray:
    """sd-cli's Canny preprocessor (module docstring) of a picture ``(H, W, 3)`` in [0, 1]:
    the edges ``(H, W)`` float32 (``strong`` on edges, 0 elsewhere)."""
    x = np.asarray(rgb, np.float32)
    gray = np.float32(0.2989) * x[..., 0] + np.float32(0.5870) * x[..., 1] + np.float32(0.1140) * x[..., 2]
    r = np.arange(5, dtype=np.float32) - 2
    sigma2 = np.float32(1.4) ** 2
    gk = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * sigma2)) / (2 * np.float32(np.pi) * sigma2)
    gray = _correlate(gray, gk.astype(np.float32))
    ix = _correlate(gray, np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32))
    iy = _correlate(gray, np.array([[1, 2, 1], [0, 0, 0], [-1, -2, -1]], np.float32))
    g = np.sqrt(ix * ix + iy * iy).astype(np.float32)
    gmax = g.max()
    if gmax != 0 and np.isfinite(gmax):
        g = g * np.float32(1.0 / gmax)
    angle = np.arctan2(iy, ix) * np.float32(180.0 / np.pi)
    angle = np.where(angle < 0, angle + 180.0, angle)
    h, w = g.shape
    nms = np.zeros_like(g)
    up, down = g[2:, 1:-1], g[:-2, 1:-1]  # (x, y+1), (x, y-1)
    a = angle[1:-1, 1:-1]
    # sd-cli's tests, as written: "0 >= angle && angle < 22.5" holds at 0 only, and so on
    q = np.ones_like(a)
    rr = np.ones_like(a)
    c1 = (a == 0) | ((a <= 157.5) & (a <= 180))
    c2 = ~c1 & (a <= 22.5) & (a < 67.5)
    c3 = ~c1 & ~c2 & (a <= 67.5) & (a < 112.5)
    c4 = ~c1 & ~c2 & ~c3 & (a <= 112.5) & (a < 157.5)
    q = np.where(c1, up, q)
    rr = np.where(c1, down, rr)
    q = np.where(c2, g[:-2, 2:], q)
    rr = np.where(c2, g[2:, :-2], rr)
    q = np.where(c3, g[1:-1, 2:], q)
    rr = np.where(c3, g[1:-1, :-2], rr)
    q = np.where(c4, g[:-2, :-2], q)
    rr = np.where(c4, g[2:, 2:], rr)
    cur = g[1:-1, 1:-1]
    nms[1:-1, 1:-1] = np.where((cur >= q) & (cur >= rr), cur, 0.0)
    ht = nms.max() * np.float32(high)
    lt = ht * np.float32(low)
    out = np.where(nms >= ht, np.float32(strong), np.where((nms <= ht) & (nms >= lt), np.float32(weak), nms))
    keep = np.zeros_like(out, dtype=bool)
    keep[3:h - 2, 3:w - 2] = True  # sd-cli keeps 3 <= x <= W - 3
    out = np.where(keep, out, 0.0).astype(np.float32)
    for yy in range(1, h - 1):  # in place, row by row, as sd-cli's loop
        for xx in np.nonzero(out[yy, 1:w - 1] == np.float32(weak))[0] + 1:
            nb = (out[yy - 1, xx + 1], out[yy, xx + 1], out[yy - 1, xx], out[yy + 1, xx], out[yy - 1, xx - 1],
                  out[yy, xx - 1])
            out[yy, xx] = strong if any(v == np.float32(strong) for v in nb) else 0.0
    return out


def control_picture(path: str | Path, width: int, height: int, use_canny: bool = False) -> np.ndarray:
    """The control picture ``(1, 3, height, width)`` float32 in [0, 1] (resized as an init
    picture is), through :func:`canny` with ``use_canny``; the 8-bit rounding sd-cli's picture
    takes after the preprocessor is kept.

    Raises:
        InvalidArgument: not a readable picture (names ``--control-image``).
    """
    from sdplan.core.pipelines.stages.img2img import load_image

    img = (load_image(path, width, height, "--control-image")[0].transpose(1, 2, 0) + 1.0) * 0.5
    img = np.round(np.clip(img, 0, 1) * 255.0) / 255.0
    if use_canny:
        edges = np.floor(np.clip(canny(img), 0, 1) * 255.0 + 0.5) / 255.0
        img = np.repeat(edges[:, :, None], 3, 2)
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None], dtype=np.float32)


class ControlNetStage:
    """A ControlNet file ready to steer a UNet pipeline (module docstring).

    Args:
        pipe: the UNet pipeline (its pool, cancel token, ``new_runner``, head rule).
        path: the ControlNet file; placement: the ``controlnet`` module's.

    Raises:
        ModelFileError: not a ControlNet, or one whose widths do not fit the UNet.
    """

    def __init__(self, pipe: Any, path: str | Path, placement: Any) -> None:
        tf = read_tensor_file(path)
        shapes = {t.name: tuple(t.shape) for t in tf.tensors}
        ucfg = pipe.unet_cfg
        try:
            self.cfg = controlnet_config(shapes, ucfg.num_heads, ucfg.head_dim)
        except ModelLayoutError as exc:
            raise ModelFileError(str(path), str(exc)) from None
        if (self.cfg.model_channels, self.cfg.channel_mult, self.cfg.context_dim) != (
                ucfg.model_channels, ucfg.channel_mult, ucfg.context_dim):
            raise ModelFileError(str(path), f"a ControlNet of width {self.cfg.model_channels}x"
                                 f"{list(self.cfg.channel_mult)} and context {self.cfg.context_dim} does not fit "
                                 f"this UNet ({ucfg.model_channels}x{list(ucfg.channel_mult)}, context "
                                 f"{ucfg.context_dim})")
        names = {n: n for n in shapes if n.startswith(self.cfg.prefix)}
        self.shapes = shapes
        self.graph = ControlNetGraph(self.cfg, names)
        wf = WeightFile(str(path), list(names), backend=pipe.pool.get(placement.devices[0]))
        self.runner = pipe.new_runner("controlnet", self.graph, wf, placement)
        self.path = str(path)

    def output_shapes(self, n: int, h: int, w: int) -> dict[str, tuple[int, ...]]:
        """The shapes of the residuals for ``n`` latents of ``h`` x ``w`` (the UNet's extra
        inputs, for its dry run; :func:`~sdplan.core.models.controlnet.residual_shapes`)."""
        return residual_shapes(self.graph, self.shapes, n, h, w)

    def input_shapes(self, n: int, h: int, w: int) -> dict[str, tuple[int, ...]]:
        """The shapes of one ControlNet call's inputs on ``n`` latents of ``h`` x ``w`` (the
        latent, the hint at 8x its size, the timesteps, the 77-token context, SDXL's vector)."""
        cfg = self.cfg
        return {"x": (n, cfg.in_channels, h, w), "hint": (n, 3, h * 8, w * 8), "t": (n,),
                "c": (n, 77, cfg.context_dim), **({"vec": (n, cfg.adm_in_channels)} if cfg.adm_in_channels else {})}

    def measure(self, n: int, h: int, w: int) -> int:
        """Compute-buffer bytes (all devices) of one ControlNet call on ``n`` latents of
        ``h`` x ``w``, by a dry-run reserve (no weight loads)."""
        return sum(self.runner.measure(self.input_shapes(n, h, w)).values())

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Keep the ControlNet's run-scoped weights loaded for a sampling loop."""
        with self.runner.session():
            yield

    def residuals(self, x_in: np.ndarray, t: float, cond: Mapping[str, np.ndarray], hint: np.ndarray,
                  strength: float) -> dict[str, np.ndarray]:
        """The UNet's ``ctl.*`` inputs for scaled latents ``x_in`` ``(N, C, h, w)`` at timestep
        ``t`` with the conditional prompt's ``cond`` (``c``, and ``vec``; one row each, repeated
        per latent) and the control picture ``hint`` ``(1, 3, 8h, 8w)``, times ``strength``."""
        n = x_in.shape[0]
        ins = {"x": np.ascontiguousarray(x_in, np.float32),
               "hint": np.ascontiguousarray(np.repeat(hint, n, 0), np.float32),
               "t": np.full((n,), t, np.float32),
               **{k: np.ascontiguousarray(np.repeat(v, n, 0), np.float32) for k, v in cond.items()}}
        out = self.runner.run(ins)
        return {k: (v * np.float32(strength)).astype(np.float32) for k, v in out.items()}


def controlled(unet: Any, stage: ControlNetStage, hint: np.ndarray, strength: float,
               cond: Mapping[str, np.ndarray], channels: int) -> Any:
    """``unet(x, t, cond) -> out`` (a UNet session's function) with ``stage``'s residuals added
    (module docstring): computed from the first ``channels`` of ``x`` (an inpainting UNet's
    extra channels are not the ControlNet's) and the conditional prompt ``cond`` (one row per
    input), once for a CFG batch whose two halves are the same latents, added to every row."""
    def run(x: np.ndarray, t: Any, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        n = x.shape[0]
        half = n // 2 if n % 2 == 0 and n > 1 and np.array_equal(x[:n // 2], x[n // 2:]) else n
        tt = float(np.asarray(t).reshape(-1)[0])
        ctl = stage.residuals(x[:half, :channels], tt, {k: v[:1] for k, v in cond.items()}, hint, strength)
        if half != n:
            ctl = {k: np.concatenate([v, v], 0) for k, v in ctl.items()}
        return unet(x, t, {**batch, **ctl})
    return run
