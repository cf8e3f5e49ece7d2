"""A clip skip the text encoder cannot run is a one-line error naming ``--clip-skip`` (its
range from the encoder's layer count), and the pipeline that refused it keeps its encoder:
the next prompt at a valid skip encodes exactly as before (SD 1.x, SDXL, SD3 pipelines; the
``generate`` command; a running server, whose engine keeps the loaded pipeline between
requests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")

from sd3_util import CLIP_G, CLIP_HEADS, CLIP_L, SD3, T5  # noqa: E402
from sdplan.core.cli import main  # noqa: E402
from sdplan.core.errors import InvalidArgument  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import StableDiffusion  # noqa: E402
from sdplan.core.pipelines.sd3.pipeline import Sd3Pipeline  # noqa: E402
from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL  # noqa: E402
from sdxl_util import BASE  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
PROMPT = "a photo of a cat"


def test_sd1_refuses_and_keeps_its_encoder() -> None:
    with StableDiffusion(FIX / "sd1_tiny.safetensors", n_threads=1, clip_heads=2) as sd:
        n = sd.clip_cfg.n_layers
        before = sd.encode_prompt(PROMPT)
        for bad in (n + 1, 99):
            with pytest.raises(InvalidArgument, match=rf"^--clip-skip {bad}: this text encoder has {n} layers; "
                                                       rf"give 1\.\.{n}"):
                sd.encode_prompt(PROMPT, clip_skip=bad)
        assert "te" in sd.runners
        np.testing.assert_array_equal(sd.encode_prompt(PROMPT), before)
        # another valid skip still rebuilds, and the default comes back
        assert not np.array_equal(sd.encode_prompt(PROMPT, clip_skip=n), before)
        np.testing.assert_array_equal(sd.encode_prompt(PROMPT), before)


def test_sdxl_refuses_and_keeps_its_encoders() -> None:
    with StableDiffusionXL(BASE, n_threads=1) as sd:
        before = sd.encode_prompt(PROMPT)
        with pytest.raises(InvalidArgument, match=r"^--clip-skip 99: this text encoder has \d+ layers"):
            sd.encode_prompt(PROMPT, clip_skip=99)
        np.testing.assert_array_equal(sd.encode_prompt(PROMPT), before)


def test_sd3_refuses_and_keeps_its_encoders() -> None:
    files = {"diffusion_model": [str(SD3)], "clip_l": [str(CLIP_L)], "clip_g": [str(CLIP_G)],
             "t5xxl": [str(T5)], "vae": [str(SD3)]}
    with Sd3Pipeline(files, n_threads=1, clip_heads=CLIP_HEADS) as pipe:
        ctx, pooled = pipe.encode_prompt(PROMPT)
        with pytest.raises(InvalidArgument, match=r"^--clip-skip 99: this text encoder has \d+ layers"):
            pipe.encode_prompt(PROMPT, clip_skip=99)
        ctx2, pooled2 = pipe.encode_prompt(PROMPT)
        np.testing.assert_array_equal(ctx2, ctx)
        np.testing.assert_array_equal(pooled2, pooled)


def test_generate_names_the_flag(tmp_path: Path, capsys) -> None:
    out = tmp_path / "x.png"
    rc = main(["generate", "--demo", "-p", "a red circle on a blue background", "--steps", "2", "-t", "1",
               "--clip-skip", "10", "-o", str(out), "--in-process"])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert lines == ["error [invalid_argument]: --clip-skip 10: this text encoder has 3 layers; give 1..3 "
                     "(or -1 for the model's default)"], err


@pytest.mark.slow
def test_server_answers_400_and_serves_the_next_request() -> None:
    from server_util import serving

    with serving("--demo", "-t", "1") as srv:
        status, body = srv.post("/sdapi/v1/txt2img", {"prompt": "x", "clip_skip": 10, "steps": 1})
        assert status == 400 and body["error"]["code"] == "invalid_argument", body
        assert body["error"]["message"].startswith("--clip-skip 10: this text encoder has 3 layers")
        status, body = srv.post("/sdapi/v1/txt2img", {"prompt": "a red circle on a blue background", "steps": 1})
        assert status == 200 and len(body["images"]) == 1, body
