"""Model-file validation errors name the file and the tensor: head counts (from a flag or the
file's ``sdplan.*`` metadata) and tensor shapes are checked against the tensors before any
graph is built, instead of an AssertionError, a reshape or ``concat: shapes differ``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from sdplan.core.cli import main
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.unet import PREFIX, find_prefix, unet_config
from sdplan.core.models.unet_check import check_heads

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
FIX = REPO / "tests" / "fixtures"
P = PREFIX


def variant(tmp_path: Path, name: str, meta: dict[str, str] | None = None,
            tensors: dict[str, np.ndarray | None] | None = None) -> Path:
    """The demo model with metadata entries and tensors replaced (None: removed); every
    header stays consistent with its data."""
    with safe_open(str(DEMO), "np") as f:
        m = {**f.metadata(), **(meta or {})}
    d = load_file(str(DEMO))
    for k, v in (tensors or {}).items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    out = tmp_path / name
    save_file(d, str(out), metadata=m)
    return out


def error_line(capsys: pytest.CaptureFixture[str], model: Path, *extra: str) -> str:
    argv = ["generate", "-m", str(model), "-p", "a red circle", "-W", "64", "-H", "64",
            "--steps", "1", "--in-process", "-t", "1", "-o", str(model.parent / "o.png"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "AssertionError" not in err and "reshape" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err
    assert not (model.parent / "o.png").exists()
    return lines[0]


def test_head_counts_in_the_metadata(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    for value in ("0", "-2"):
        m = variant(tmp_path, f"u{value}.safetensors", {"sdplan.unet_heads": value})
        assert error_line(capsys, m) == (
            f"error [invalid_model_file]: {m}: metadata sdplan.unet_heads='{value}': a head count "
            "or width is between 1 and 4096")
    m = variant(tmp_path, "u3.safetensors", {"sdplan.unet_heads": "3"})
    assert error_line(capsys, m) == (
        f"error [invalid_model_file]: {m}: tensor {P}input_blocks.1.1.proj_in.weight: 64 channels "
        "do not split into 3 heads of equal width (heads from the file's metadata "
        "sdplan.unet_heads=3)")
    m = variant(tmp_path, "c3.safetensors", {"sdplan.clip_heads": "3"})
    assert error_line(capsys, m) == (
        f"error [invalid_model_file]: {m}: tensor cond_stage_model.transformer.text_model."
        "embeddings.token_embedding.weight: CLIP width 64 is not divisible by 3 heads (heads "
        "from the file's metadata sdplan.clip_heads=3)")


def test_head_flags(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    m = variant(tmp_path, "m.safetensors")
    assert error_line(capsys, m, "--unet-heads", "3").endswith(
        "64 channels do not split into 3 heads of equal width (heads from --unet-heads 3)")
    assert error_line(capsys, m, "--clip-heads", "3").endswith(
        "CLIP width 64 is not divisible by 3 heads (heads from --clip-heads 3)")
    assert error_line(capsys, m, "--unet-heads", "0") == (
        "error [invalid_argument]: --unet-heads must be between 1 and 4096, got 0")


def test_shapes_that_lie_consistently(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    wide = variant(tmp_path, "wide.safetensors", tensors={
        f"{P}input_blocks.1.0.out_layers.3.weight": np.zeros((72, 64, 3, 3), np.float32),
        f"{P}input_blocks.1.0.out_layers.3.bias": np.zeros(72, np.float32)})
    assert error_line(capsys, wide) == (
        f"error [invalid_model_file]: {wide}: tensor {P}input_blocks.1.0.out_layers.3.weight has "
        "shape (72, 64, 3, 3); the UNet needs (64, 64, 3, 3)")
    no_up = variant(tmp_path, "noup.safetensors", tensors={
        f"{P}output_blocks.1.2.conv.weight": None, f"{P}output_blocks.1.2.conv.bias": None})
    assert error_line(capsys, no_up) == (
        f"error [invalid_model_file]: {no_up}: {P}output_blocks.2 joins the skip connection of "
        f"{P}input_blocks.3 from another resolution (the up- and downsampling layers do not match)")
    ctx = variant(tmp_path, "ctx.safetensors", tensors={
        f"{P}output_blocks.4.1.transformer_blocks.0.attn2.to_v.weight": np.zeros((64, 32), np.float32)})
    assert error_line(capsys, ctx).endswith(
        f"tensor {P}output_blocks.4.1.transformer_blocks.0.attn2.to_v.weight has shape (64, 32); "
        "the UNet needs (64, 64)")


@pytest.mark.parametrize("name", ["sd1_tiny", "sd2_tiny", "sdxl_tiny", "sdxl_refiner_tiny",
                                  "sd1_inpaint_unet"])
def test_every_fixture_unet_passes(name: str) -> None:
    shapes = {t.name: t.shape for t in read_tensor_file(FIX / f"{name}.safetensors").tensors}
    family = "sdxl" if name.startswith("sdxl") else "sd2" if name.startswith("sd2") else "sd1"
    heads = {"sd1_tiny": (2, None), "sd2_tiny": (None, 8), "sd1_inpaint_unet": (2, None)}.get(name, (None, 8))
    cfg = unet_config(shapes, family, *heads, prefix=find_prefix(shapes))
    assert cfg.model_channels > 0


def test_check_heads_rules() -> None:
    assert check_heads("t", 64, 8, None) == 8 and check_heads("t", 640, None, 64) == 10
    with pytest.raises(ModelLayoutError, match="a head count must be at least 1, got 0"):
        check_heads("t", 64, 0, None)
    with pytest.raises(ModelLayoutError, match="a head width must be at least 1, got -3"):
        check_heads("t", 64, None, -3)
    with pytest.raises(ModelLayoutError, match="tensor t: 96 channels do not split into 7 heads"):
        check_heads("t", 96, 7, None)
