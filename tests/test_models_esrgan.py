"""ESRGAN upscalers: the real compact x4 network against its PyTorch reference output, whole
and tiled; RRDBNet (both naming layouts, with and without pixel-unshuffle) against a numpy
reference; a compact network saved as torch.save does (zip and legacy .pth) against a numpy
reference, itself checked against torch (``ref`` marker); tiling geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from sdplan.core.errors import ModelFileError
from sdplan.core.models.esrgan import canonical_rrdb_names, detect_esrgan, tile_grid


def _engine() -> None:
    g = pytest.importorskip("sdplan._ggml")
    if not hasattr(g, "Graph"):
        pytest.skip("sdplan._ggml has no Graph (engine not built)")


# ------------------------------------------------------------------------ numpy reference
def np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """3x3 (or 1x1) conv, stride 1, same padding; x (C, H, W), w (O, C, K, K)."""
    k = w.shape[-1]
    p = k // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    h, wd = x.shape[1:]
    cols = np.stack([xp[:, i:i + h, j:j + wd] for i in range(k) for j in range(k)], 1)  # C, KK, H, W
    y = np.einsum("ckhw,ock->ohw", cols, w.reshape(w.shape[0], w.shape[1], k * k))
    return y + b[:, None, None] if b is not None else y


def np_lrelu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, 0.2 * x)


def np_up2(x: np.ndarray, s: int = 2) -> np.ndarray:
    return x.repeat(s, 1).repeat(s, 2)


def np_unshuffle(x: np.ndarray, r: int) -> np.ndarray:
    c, h, w = x.shape
    return x.reshape(c, h // r, r, w // r, r).transpose(0, 2, 4, 1, 3).reshape(c * r * r, h // r, w // r)


def np_compact(wt: dict[str, np.ndarray], x: np.ndarray, n_conv: int, scale: int) -> np.ndarray:
    """SRVGGNetCompact in float64; x (C, H, W) -> (C, H * scale, W * scale)."""
    wt = {k: v.astype(np.float64) for k, v in wt.items()}
    h = x.astype(np.float64)
    for i in range(n_conv + 1):
        h = np_conv(h, wt[f"body.{2 * i}.weight"], wt[f"body.{2 * i}.bias"])
        h = np.where(h > 0, h, wt[f"body.{2 * i + 1}.weight"][:, None, None] * h)
    last = 2 * (n_conv + 1)
    h = np_conv(h, wt[f"body.{last}.weight"], wt[f"body.{last}.bias"])
    c, hh, ww = h.shape
    s = scale
    shuffled = h.reshape(c // (s * s), s, s, hh, ww).transpose(0, 3, 1, 4, 2).reshape(c // (s * s), hh * s, ww * s)
    return shuffled + np_up2(x.astype(np.float64), s)


def np_rrdb(wt: dict[str, np.ndarray], x: np.ndarray, n_blocks: int, n_up: int, unshuffle: int) -> np.ndarray:
    def conv(name: str, v: np.ndarray) -> np.ndarray:
        return np_conv(v, wt[name + ".weight"], wt.get(name + ".bias"))

    v = np_unshuffle(x, unshuffle) if unshuffle > 1 else x
    feat = conv("conv_first", v)
    h = feat
    for b in range(n_blocks):
        y = h
        for k in (1, 2, 3):
            feats = y
            for j in range(1, 5):
                feats = np.concatenate([feats, np_lrelu(conv(f"body.{b}.rdb{k}.conv{j}", feats))])
            y = conv(f"body.{b}.rdb{k}.conv5", feats) * 0.2 + y
        h = y * 0.2 + h
    h = feat + conv("conv_body", h)
    for u in range(1, n_up + 1):
        h = np_lrelu(conv(f"conv_up{u}", np_up2(h)))
    return conv("conv_last", np_lrelu(conv("conv_hr", h)))


def rrdb_weights(rng: np.random.Generator, cin: int, feat: int = 8, grow: int = 4,
                 n_blocks: int = 1, n_up: int = 2) -> dict[str, np.ndarray]:
    def conv(o: int, i: int) -> tuple[np.ndarray, np.ndarray]:
        return ((rng.standard_normal((o, i, 3, 3)) / np.sqrt(9 * i)).astype(np.float32),
                (rng.standard_normal(o) * 0.05).astype(np.float32))

    out: dict[str, np.ndarray] = {}

    def put(name: str, o: int, i: int) -> None:
        out[name + ".weight"], out[name + ".bias"] = conv(o, i)

    put("conv_first", feat, cin)
    for b in range(n_blocks):
        for k in (1, 2, 3):
            for j in range(1, 5):
                put(f"body.{b}.rdb{k}.conv{j}", grow, feat + (j - 1) * grow)
            put(f"body.{b}.rdb{k}.conv5", feat, feat + 4 * grow)
    put("conv_body", feat, feat)
    for u in range(1, n_up + 1):
        put(f"conv_up{u}", feat, feat)
    put("conv_hr", feat, feat)
    put("conv_last", 3, feat)
    return out


def to_old_names(wt: dict[str, np.ndarray], n_blocks: int, n_up: int) -> dict[str, np.ndarray]:
    """The original ESRGAN ``model.N`` layout of new-style RRDB weights."""
    ren = {"conv_first": "model.0", "conv_body": f"model.1.sub.{n_blocks}"}
    idx = 3
    for u in range(1, n_up + 1):
        ren[f"conv_up{u}"] = f"model.{idx}"
        idx += 3
    ren["conv_hr"], ren["conv_last"] = f"model.{idx - 1}", f"model.{idx + 1}"
    out = {}
    for k, v in wt.items():
        base, kind = k.rsplit(".", 1)
        if base.startswith("body."):
            _, b, rdb, conv = base.split(".")
            out[f"model.1.sub.{b}.{rdb.upper()}.{conv}.0.{kind}"] = v
        else:
            out[f"{ren[base]}.{kind}"] = v
    return out


# ------------------------------------------------------------------------------- tests
def test_old_and_new_rrdb_names_agree() -> None:
    wt = rrdb_weights(np.random.default_rng(0), 3)
    old = to_old_names(wt, 1, 2)
    assert "model.1.sub.0.RDB2.conv3.0.weight" in old and "model.10.weight" in old
    names = canonical_rrdb_names(list(old))
    assert sorted(names) == sorted(wt)
    assert all(old[v].shape == wt[k].shape for k, v in names.items())


@pytest.mark.parametrize("cin,unshuffle,scale", [(3, 1, 4), (12, 2, 2)])
def test_detect_rrdb(cin: int, unshuffle: int, scale: int) -> None:
    wt = rrdb_weights(np.random.default_rng(0), cin, n_blocks=2)
    cfg = detect_esrgan({k: v.shape for k, v in wt.items()})
    assert (cfg.kind, cfg.scale, cfg.unshuffle, cfg.n_conv, cfg.features, cfg.growth, cfg.n_up) == (
        "rrdb", scale, unshuffle, 2, 8, 4, 2)


def test_detect_compact_from_shapes() -> None:
    shapes = {"body.0.weight": (24, 3, 3, 3), "body.0.bias": (24,), "body.1.weight": (24,)}
    for i in range(1, 6):
        shapes |= {f"body.{2 * i}.weight": (24, 24, 3, 3), f"body.{2 * i + 1}.weight": (24,)}
    shapes |= {"body.12.weight": (12, 24, 3, 3)}
    cfg = detect_esrgan(shapes)
    assert (cfg.kind, cfg.scale, cfg.features, cfg.n_conv, cfg.receptive_radius) == ("compact", 2, 24, 5, 7)


@pytest.mark.parametrize("shapes,match", [
    ({"foo.weight": (3,)}, "not an ESRGAN"),
    ({"body.0.weight": (8, 3, 3, 3), "body.1.weight": (8,), "body.2.weight": (10, 8, 3, 3)}, "scale"),
    ({"body.0.weight": (8, 3, 3, 3), "body.2.weight": (12, 8, 3, 3)}, "PReLU"),
    ({"conv_first.weight": (8, 3, 3, 3)}, "missing"),
])
def test_detect_errors_name_the_file(shapes: dict, match: str) -> None:
    with pytest.raises(ModelFileError, match=match) as exc:
        detect_esrgan(shapes, "up.pth")
    assert "up.pth" in str(exc.value)


@pytest.mark.parametrize("h,w,tile,overlap,align", [(64, 64, 27, 18, 1), (100, 37, 16, 5, 1),
                                                     (64, 48, 20, 6, 2), (10, 10, 64, 18, 1)])
def test_tile_grid_covers_once_with_context(h: int, w: int, tile: int, overlap: int, align: int) -> None:
    (rh, rw), tiles = tile_grid(h, w, tile, overlap, align)
    cover = np.zeros((h, w), int)
    for t in tiles:
        assert 0 <= t.y0 and t.y0 + rh <= h and 0 <= t.x0 and t.x0 + rw <= w
        assert t.y0 % align == 0 and t.x0 % align == 0
        cover[t.cy0:t.cy1, t.cx0:t.cx1] += 1
        assert t.cy0 - t.y0 >= overlap or t.y0 == 0
        assert t.y0 + rh - t.cy1 >= overlap or t.y0 + rh == h
        assert t.cx0 - t.x0 >= overlap or t.x0 == 0
        assert t.x0 + rw - t.cx1 >= overlap or t.x0 + rw == w
    assert (cover == 1).all()


@pytest.mark.parametrize("old_names", [False, True])
@pytest.mark.parametrize("cin,unshuffle,n_up", [(3, 1, 2), (12, 2, 2)])
def test_rrdb_matches_numpy(tmp_path: Path, old_names: bool, cin: int, unshuffle: int, n_up: int) -> None:
    _engine()
    from sdplan.core.pipelines.stages.upscale import Upscaler

    rng = np.random.default_rng(1)
    wt = rrdb_weights(rng, cin, n_up=n_up)
    path = tmp_path / "rrdb.safetensors"
    save_file(to_old_names(wt, 1, n_up) if old_names else wt, str(path))
    x = rng.random((1, 3, 8, 6), dtype=np.float32)
    with Upscaler(path, n_threads=2) as up:
        y = up.upscale_array(x)
    ref = np_rrdb(wt, x[0], 1, n_up, unshuffle)
    assert y.shape == (1, 3, 8 * up.scale, 6 * up.scale) == (1, *ref.shape)
    np.testing.assert_allclose(y[0], ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_torch_saved_compact_pth_matches_numpy(tmp_path: Path, legacy: bool) -> None:
    """A compact x2 network written as torch.save writes it (``{"params": state_dict}``),
    through the restricted reader and the engine, gives the numpy reference output."""
    _engine()
    from pth_writer import compact_weights, save_compact
    from sdplan.core.pipelines.stages.upscale import Upscaler

    wt = compact_weights()
    path = save_compact(tmp_path / "compact_x2.pth", wt, legacy=legacy)
    x = np.random.default_rng(2).random((1, 3, 12, 10), dtype=np.float32)
    with Upscaler(path, n_threads=2) as up:
        assert (up.cfg.kind, up.scale, up.cfg.features, up.cfg.n_conv) == ("compact", 2, 8, 2)
        y = up.upscale_array(x)
    ref = np_compact(wt, x[0], 2, 2)
    assert y.shape == (1, 3, 24, 20)
    np.testing.assert_allclose(y[0], ref, atol=1e-5)
    assert float(np.abs(ref - np_up2(x[0])).max()) > 0.05  # the network adds to the upsampled input


@pytest.mark.ref
def test_numpy_compact_matches_torch() -> None:
    """np_compact is the PyTorch SRVGGNetCompact forward (conv, PReLU, pixel shuffle, + nearest)."""
    torch = pytest.importorskip("torch")
    from pth_writer import compact_weights

    fn = torch.nn.functional
    wt = compact_weights()
    t = {k: torch.from_numpy(v).double() for k, v in wt.items()}
    x = np.random.default_rng(2).random((1, 3, 12, 10))
    h = xt = torch.from_numpy(x)
    for i in range(3):
        h = fn.prelu(fn.conv2d(h, t[f"body.{2 * i}.weight"], t[f"body.{2 * i}.bias"], padding=1),
                     t[f"body.{2 * i + 1}.weight"])
    h = fn.pixel_shuffle(fn.conv2d(h, t["body.6.weight"], t["body.6.bias"], padding=1), 2)
    y = h + fn.interpolate(xt, scale_factor=2, mode="nearest")
    np.testing.assert_allclose(np_compact(wt, x[0], 2, 2), y[0].numpy(), atol=1e-12)


@pytest.fixture(scope="module")
def compact(shared_dir: Path):  # type: ignore[no-untyped-def]
    _engine()
    from sdplan.core.pipelines.stages.upscale import Upscaler

    w = shared_dir / "weights"
    ref = load_file(str(w / "reference" / "realesr_animevideov3_x4.safetensors"))
    with Upscaler(w / "realesr-animevideov3.safetensors", n_threads=2) as up:
        yield up, ref


def test_real_compact_x4_matches_reference(compact) -> None:  # type: ignore[no-untyped-def]
    up, ref = compact
    assert (up.cfg.kind, up.scale, up.cfg.features, up.cfg.n_conv) == ("compact", 4, 64, 16)
    up.tile = None
    y = up.upscale_array(ref["input"])
    err = float(np.abs(y - ref["output"]).max())
    assert err < 1e-4, err
    assert float(np.abs(y - np.repeat(np.repeat(ref["input"], 4, 2), 4, 3)).max()) > 0.05


def test_real_compact_tiled_has_no_seams(compact) -> None:  # type: ignore[no-untyped-def]
    """Tiles of a 64 x 40 crop (3 x 1 tiles of 63 x 40: 27 px cores, 18 px of context) give
    the untiled result; with less context than the receptive field, seams appear."""
    up, ref = compact
    x = np.ascontiguousarray(ref["input"][:, :, :, :40])
    up.tile = None
    whole = up.upscale_array(x)
    # the crop edge changes only outputs within the receptive field (18 px) of it
    np.testing.assert_allclose(whole[..., :88], ref["output"][..., :88], atol=1e-4)
    up.tile = 27
    try:
        tiled = up.upscale_array(x)
        assert float(np.abs(tiled - whole).max()) < 1e-5
        up.overlap = 6  # the check can fail: too little context leaves seams
        seamy = up.upscale_array(x)
        assert float(np.abs(seamy - whole).max()) > 1e-3
    finally:
        up.tile, up.overlap = None, up.cfg.receptive_radius


@pytest.mark.parametrize("kernel", ["off", "avx512", "amx"])
def test_real_compact_x4_on_each_cpu_kernel_path(shared_dir: Path, kernel: str) -> None:
    """Where the CPU runs sdplan's AMX kernel the convolution kernels are held in bf16
    (UpscalerGraph.cpu_bf16_kernels; everything else f32) and the output stays within 3e-2 of
    the PyTorch fp32 reference (pictures in [0, 1]; mean error within 2e-3); elsewhere f32 and
    1e-4 as before. Measured with AMX: max 1.1e-2 (3 levels of 255 at the worst pixel), mean 7.2e-4;
    the f32 path 4.0e-6 and 1.8e-7."""
    _engine()
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from test_bf16_kernels import kernel_path

    w = shared_dir / "weights"
    ref = load_file(str(w / "reference" / "realesr_animevideov3_x4.safetensors"))
    for _ in kernel_path(kernel):
        with Upscaler(w / "realesr-animevideov3.safetensors", n_threads=2, tile=None) as up:
            held = {d for n, d in up.runner.wf.dtypes.items() if len(up.runner.wf.infos[n].shape) == 4}
            y = up.upscale_array(ref["input"])
    diff = np.abs(y - ref["output"])
    print(f"{kernel}: conv kernels {held}, max {diff.max():.2e}, mean {diff.mean():.2e}")
    assert held == ({"bf16"} if kernel == "amx" else {"f32"})
    assert diff.max() < (3e-2 if kernel == "amx" else 1e-4)
    assert diff.mean() < (2e-3 if kernel == "amx" else 1e-5)
