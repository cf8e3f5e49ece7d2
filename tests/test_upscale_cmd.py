"""``sdplan upscale``: the real compact x4 model on the CPU, with disk residency, under a
budget (tiles), on an RPC device (weights on it or staged from the CPU) — all the same
picture; .pth models, repeats, a hostile .pth and bad arguments."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import require_or_skip
from PIL import Image
from pth_writer import compact_weights, save_compact
from rpc_util import rpc_servers, sdplan_cmd
from safetensors.numpy import load_file
from sdplan.core.cli import main


@pytest.fixture(autouse=True)
def _engine() -> None:
    g = pytest.importorskip("sdplan._ggml")
    if not hasattr(g, "Graph"):
        pytest.skip("sdplan._ggml has no Graph (engine not built)")


@pytest.fixture(scope="module")
def compact_pth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compact x2 upscaler written as ``torch.save({"params": state_dict})`` writes it."""
    return save_compact(tmp_path_factory.mktemp("pth") / "compact_x2.pth", compact_weights())


def sdplan(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sdplan_cmd(*args, "--threads", "2"), capture_output=True, text=True,
                          timeout=timeout)


def _png(a: np.ndarray, path: Path) -> Path:
    Image.fromarray(a).save(path)
    return path


def _read(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def real(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(model path, input png of the reference input, reference output as uint8, tmp dir)."""
    w = shared_dir / "weights"
    ref = load_file(str(w / "reference" / "realesr_animevideov3_x4.safetensors"))
    tmp = tmp_path_factory.mktemp("upscale")
    to8 = lambda x: (np.clip(x[0], 0, 1).transpose(1, 2, 0) * 255 + 0.5).astype(np.uint8)  # noqa: E731
    src = _png(to8(ref["input"]), tmp / "in.png")
    return w / "realesr-animevideov3.safetensors", src, to8(ref["output"]).astype(int), tmp


@pytest.fixture(scope="module")
def cpu_result(real):  # type: ignore[no-untyped-def]
    model, src, ref8, tmp = real
    res = sdplan("upscale", "-i", str(src), "--upscale-model", str(model), "-o", str(tmp / "cpu.png"))
    assert res.returncode == 0, res.stderr
    return _read(tmp / "cpu.png")


def test_cpu_matches_reference(real, cpu_result) -> None:  # type: ignore[no-untyped-def]
    _, _, ref8, _ = real
    assert cpu_result.shape == (256, 256, 3)
    diff = np.abs(cpu_result - ref8)
    # the PNG input is the reference input rounded to 8 bits: a few levels at most
    assert diff.max() <= 4 and diff.mean() < 0.5, (diff.max(), diff.mean())


def test_disk_residency_same_picture(real, cpu_result) -> None:  # type: ignore[no-untyped-def]
    model, src, _, tmp = real
    out = tmp / "disk.png"
    res = sdplan("upscale", "-i", str(src), "--upscale-model", str(model), "-o", str(out),
                 "--params-backend", "upscaler=disk")
    assert res.returncode == 0, res.stderr
    assert "weights disk" in res.stdout
    np.testing.assert_array_equal(_read(out), cpu_result)


def _big(src: Path, tmp: Path) -> Path:
    with Image.open(src) as im:
        return _png(np.asarray(im.convert("RGB").resize((80, 96), Image.BICUBIC)), tmp / "big.png")


def test_budget_tiles_same_picture(real, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A 96 x 80 picture under a 6 MiB budget runs in tiles and gives the untiled picture to
    rounding (the CPU has no budget in a plan, spec section 7: the placement is given directly; the
    whole picture needs about 8 MiB with the Winograd convolution, more with im2col)."""
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from sdplan.core.runtime.runner import ModulePlacement

    model, src, _, _ = real
    with Image.open(_big(src, tmp_path)) as im:
        img = np.asarray(im.convert("RGB"))
    with Upscaler(model, n_threads=2) as up:
        whole = up.upscale_image(img)
        assert up.choose_tile(96, 80) >= 96
    with Upscaler(model, placement=ModulePlacement(("CPU",), budget=6 << 20), n_threads=2) as up:
        tile = up.choose_tile(96, 80)
        assert tile < 80
        tiled = up.upscale_image(img)
    # the Winograd convolution rounds by a pixel's place in its 4x4 tile: a tile grid that
    # starts elsewhere may move a colour by one level, rarely
    diff = np.abs(tiled.astype(int) - whole.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


@pytest.mark.rpc
def test_rpc_device_same_picture(real, cpu_result) -> None:  # type: ignore[no-untyped-def]
    from sdplan.core.runtime import devices

    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    model, src, _, tmp = real
    with rpc_servers(1, threads=2) as (s,):
        for name, params in (("rpc", []), ("rpc_cpu", ["--params-backend", "upscaler=CPU"])):
            out = tmp / f"{name}.png"
            res = sdplan("upscale", "-i", str(src), "--upscale-model", str(model), "-o", str(out),
                         "--rpc-servers", s.endpoint, "--backend", "upscaler=RPC0", *params)
            assert res.returncode == 0, res.stderr
            assert "RPC0" in res.stdout
            assert np.abs(_read(out) - cpu_result).max() <= 1, name
        # RPC devices have budgets: 16 MiB cuts the 96 x 80 picture into tiles
        big = _big(src, tmp)
        outs = []
        for extra in ([], ["--rpc-servers", s.endpoint, "--backend", "upscaler=RPC0",
                           "--max-vram", "0.016"]):
            out = tmp / f"big{len(outs)}.png"
            res = sdplan("-v", "upscale", "-i", str(big), "--upscale-model", str(model),
                         "-o", str(out), *extra)
            assert res.returncode == 0, res.stderr
            outs.append((_read(out), res.stderr))
    assert "1 tiles" in outs[0][1] and "1 tiles" not in outs[1][1], outs[1][1][-2000:]
    assert np.abs(outs[0][0] - outs[1][0]).max() <= 1


def test_pth_model_and_repeats(tmp_path: Path, compact_pth: Path) -> None:
    rng = np.random.default_rng(0)
    src = _png((rng.random((10, 12, 3)) * 255).astype(np.uint8), tmp_path / "in.png")
    out = tmp_path / "out.png"
    assert main(["upscale", "-i", str(src), "--upscale-model", str(compact_pth),
                 "-o", str(out), "--upscale-repeats", "2", "--threads", "2"]) == 0
    assert _read(out).shape == (40, 48, 3)


def test_hostile_pth_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {tmp_path / 'MARKER'}",))

    model = tmp_path / "evil.pth"
    model.write_bytes(pickle.dumps({"params": {"body.0.weight": Evil()}}, protocol=2))
    src = _png(np.zeros((8, 8, 3), np.uint8), tmp_path / "in.png")
    out = tmp_path / "out.png"
    assert main(["upscale", "-i", str(src), "--upscale-model", str(model), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "evil.pth" in err and "refused global" in err and "system" in err
    assert not (tmp_path / "MARKER").exists() and not out.exists()


@pytest.mark.parametrize("args,match", [
    (["--upscale-repeats", "0"], "--upscale-repeats"),
    (["--upscale-tile", "2"], "--upscale-tile"),
    (["--backend", "upscaler=nope"], "nope"),
])
def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str], compact_pth: Path,
                       args: list[str], match: str) -> None:
    src = _png(np.zeros((8, 8, 3), np.uint8), tmp_path / "in.png")
    assert main(["upscale", "-i", str(src), "--upscale-model", str(compact_pth),
                 "-o", str(tmp_path / "o.png"), *args]) == 2
    assert match in capsys.readouterr().err


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], compact_pth: Path) -> None:
    assert main(["upscale", "-i", str(tmp_path / "none.png"), "--upscale-model",
                 str(compact_pth)]) == 2
    assert "none.png" in capsys.readouterr().err
    src = _png(np.zeros((8, 8, 3), np.uint8), tmp_path / "in.png")
    assert main(["upscale", "-i", str(src), "--upscale-model", str(tmp_path / "none.pth")]) == 2
    assert "none.pth" in capsys.readouterr().err
