"""No silent failure of the maths: a NaN or an infinity in a latent (checked after every step
of the shared sampling loops) or in the decoded picture is an error naming the step and the
likely cause (weights, sigmas, LoRA weight), exit code 2, and nothing is written over an
existing file. ``--sigmas`` values are finite, non-negative and at most 1001; LoRA weights
lie within +-10."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from sdplan.core.cli import main
from sdplan.core.errors import NonFiniteError
from sdplan.core.pipelines.finite import likely_causes, non_finite_tensor
from sdplan.core.pipelines.stages.results import image_to_uint8
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.finite import check_finite, finite_steps
from sdplan.core.sampling.flow import sample_flow
from sdplan.core.sampling.options import SamplingOptions, parse_sigmas
from sdplan.core.sampling.samplers import sample
from sdplan.core.text.lora_tags import extract_lora_tags
from sdplan.core.text.prompt import PromptError

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
LORA = REPO / "resources" / "demo" / "loras" / "outline.safetensors"


def test_check_finite_and_the_step_callback() -> None:
    x = np.zeros((1, 4, 2, 2), np.float32)
    assert check_finite(x, "x") is x
    seen: list[int] = []
    cb = finite_steps(lambda i, x, d: seen.append(i), 20)
    cb(0, x, x)
    x[0, 1, 1, 0] = np.nan
    with pytest.raises(NonFiniteError, match=r"^the latent after step 3 of 20 holds NaN or "
                                             r"infinite values \(nothing was written\)$"):
        cb(2, x, x)
    assert seen == [0]  # no preview of the broken latent
    with pytest.raises(NonFiniteError, match="decoded picture"):
        image_to_uint8(np.full((3, 2, 2), np.inf, np.float32))


def test_every_sampler_of_both_loops_stops_at_the_first_broken_step() -> None:
    """A denoiser whose estimate turns infinite at its third call: every sampler raises at a
    step, not with a black picture."""
    from sdplan.core.sampling.flow import FLOW_SAMPLERS
    from sdplan.core.sampling.noise import PhiloxNoise
    from sdplan.core.sampling.samplers import SAMPLERS

    def broken(calls: list[int]):  # noqa: ANN202
        def den(x: np.ndarray, s: float) -> np.ndarray:
            calls.append(1)
            return np.full_like(x, np.inf if len(calls) >= 3 else 0.5)
        den.with_uncond = lambda x, s: (den(x, s), den(x, s))  # type: ignore[attr-defined]
        return den

    sigmas = np.array([14.6, 8.0, 4.0, 2.0, 1.0, 0.5, 0.0], np.float32)
    np_errors = np.errstate(all="ignore")  # the infinities propagate until the check
    np_errors.__enter__()
    for name in SAMPLERS:
        x = np.ones((1, 4, 4, 4), np.float32)
        with pytest.raises(NonFiniteError, match=r"latent after step \d of 6|final latent"):
            sample(name, broken([]), x, sigmas, noise=PhiloxNoise(1))
    flow_sigmas = np.linspace(1.0, 0.0, 7).astype(np.float32)
    for name in FLOW_SAMPLERS:
        calls: list[int] = []

        def vel(x: np.ndarray, s: float, calls: list[int] = calls) -> np.ndarray:
            calls.append(1)
            return np.full_like(x, np.nan if len(calls) >= 3 else 0.1)

        with pytest.raises(NonFiniteError, match=r"latent after step \d of 6|final latent"):
            sample_flow(name, vel, np.ones((1, 4, 4, 4), np.float32), flow_sigmas,
                        noise=PhiloxNoise(1))
    np_errors.__exit__(None, None, None)


def test_sigmas_finite_non_negative_and_at_most_1001() -> None:
    assert parse_sigmas("14.6,7,0") == (14.6, 7.0, 0.0)
    for text, message in (("nan,1", "value 1 is nan; sigmas must be finite"),
                          ("1,inf", "value 2 is inf"), ("1e999,0", "value 1 is inf"),
                          ("1e308,1", "value 1 is 1e\\+308; sigmas must be finite in the engine's float32"),
                          ("3,-1,0", "value 2 is -1; sigmas must not be negative")):
        with pytest.raises(SamplingError, match=message):
            SamplingOptions(sigmas=parse_sigmas(text))
    SamplingOptions(sigmas=(1.0,) * 1000 + (0.0,))  # 1000 steps
    with pytest.raises(SamplingError, match="holds 1001 values; at most 1001 .1000 steps, ending in 0"):
        SamplingOptions(sigmas=(1.0,) * 1001)  # 1001 steps once the 0 is added
    with pytest.raises(SamplingError, match="holds 3000 values"):
        SamplingOptions.from_request({"sigmas": [1.0] * 3000})


def test_lora_weights_within_the_stated_range() -> None:
    assert extract_lora_tags("a <lora:x:10> <lora:y:-2.5>")[1][0].weight == 10.0
    for prompt in ("a <lora:x:1e308>", "a <lora:x:-11>", "a <lora:x:6> <lora:x:6>"):
        with pytest.raises(PromptError, match="LoRA weights must be between -10 and 10"):
            extract_lora_tags(prompt)


def poisoned(tmp_path: Path, source: Path, suffix: str, value: float, name: str) -> Path:
    """``source`` with one value of its first tensor whose name ends in ``suffix`` set."""
    with safe_open(str(source), "np") as f:
        meta = f.metadata()
    tensors = load_file(str(source))
    key = next(k for k in tensors if k.endswith(suffix))
    tensors[key] = tensors[key].copy()
    tensors[key].flat[0] = value
    out = tmp_path / name
    save_file(tensors, str(out), metadata=meta)
    return out


def test_likely_causes_name_the_tensor_the_sigmas_or_the_lora(tmp_path: Path) -> None:
    bad = poisoned(tmp_path, DEMO, "input_blocks.0.0.weight", np.nan, "bad.safetensors")
    assert non_finite_tensor(bad) == "model.diffusion_model.input_blocks.0.0.weight"
    assert non_finite_tensor(DEMO) is None
    assert likely_causes({"model_files": {"model": [str(bad)]}}) == (
        f"weights: tensor 'model.diffusion_model.input_blocks.0.0.weight' of {bad} holds NaN "
        "or infinite values",)
    causes = likely_causes({"model_files": {"model": [str(DEMO)]}, "sigmas": [1e30, 1.0],
                            "prompt": "a <lora:outline:4>",
                            "lora_model_dir": str(LORA.parent)})
    assert causes[0].startswith("sigmas: --sigmas holds 1e+30")
    assert causes[1].startswith("LoRA weight: <lora:outline:4> scales its patch")
    assert likely_causes({"model_files": {"model": str(DEMO)}})[0].startswith(
        "no tensor of the files holds NaN or infinity")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def failed(capsys: pytest.CaptureFixture[str], argv: list[str], out: Path) -> str:
    """Run ``sdplan ARGV`` with an existing ``out``: exit 2, one error line, ``out`` kept."""
    out.write_bytes(b"the user's earlier picture")
    before = digest(out)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err
    assert digest(out) == before
    return lines[0]


def gen(model: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "-m", str(model), "-p", "a red circle on a blue background", "-W", "64",
            "-H", "64", "--steps", "3", "--in-process", "-t", "1", "-o", str(out), *extra]


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf_weights_are_an_error_naming_the_tensor(tmp_path: Path, capsys, value) -> None:
    pytest.importorskip("sdplan._ggml")
    bad = poisoned(tmp_path, DEMO, "input_blocks.0.0.weight", value, "bad.safetensors")
    out = tmp_path / "o.png"
    line = failed(capsys, gen(bad, out, "--preview-path", str(tmp_path / "prev")), out)
    assert line == ("error [non_finite_result]: the latent after step 1 of 3 holds NaN or infinite "
                    "values (nothing was written); likely cause: weights: tensor "
                    f"'model.diffusion_model.input_blocks.0.0.weight' of {bad} holds NaN or "
                    "infinite values")
    assert not list((tmp_path / "prev").glob("*.png"))  # no preview of a broken latent


def test_a_broken_decoder_is_caught_in_the_picture(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    bad = poisoned(tmp_path, DEMO, "decoder.conv_out.bias", np.inf, "vae.safetensors")
    out = tmp_path / "o.png"
    line = failed(capsys, gen(bad, out), out)
    assert line.startswith("error [non_finite_result]: the decoded picture holds NaN or infinite")
    assert "first_stage_model.decoder.conv_out.bias" in line


def test_huge_sigmas_are_named(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    out = tmp_path / "o.png"
    line = failed(capsys, gen(DEMO, out, "--sigmas", "3e38,1"), out)
    assert line.startswith("error [non_finite_result]: the latent after step 1 of 2")
    assert "likely cause: sigmas: --sigmas holds 3e+38" in line
    line = failed(capsys, gen(DEMO, out, "--sigmas", "1e308,1"), out)
    assert line.startswith("error [invalid_sampling]: --sigmas value 1 is 1e+308")


@pytest.mark.parametrize(("extra", "message"), [
    (["--sigmas", "nan,1"], "error [invalid_sampling]: --sigmas value 1 is nan"),
    (["--sigmas", "1,-1"], "error [invalid_sampling]: --sigmas value 2 is -1"),
    (["--sigmas", ",".join(["1"] * 3000)], "error [invalid_sampling]: --sigmas holds 3000 values"),
])
def test_bad_sigmas_are_refused_before_the_engine(tmp_path: Path, capsys, extra, message) -> None:
    out = tmp_path / "o.png"
    assert failed(capsys, gen(DEMO, out, *extra), out).startswith(message)


def test_a_lora_weight_out_of_range_and_a_broken_lora(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    out = tmp_path / "o.png"
    argv = gen(DEMO, out, "--lora-model-dir", str(LORA.parent))
    argv[4] = "a red circle <lora:outline:1e308>"
    assert "LoRA weights must be between -10 and 10" in failed(capsys, argv, out)
    bad = poisoned(tmp_path, LORA, "lora_B.weight", np.inf, "outline.safetensors")
    argv = gen(DEMO, out, "--lora-model-dir", str(tmp_path))
    argv[4] = "a red circle <lora:outline:1>"
    line = failed(capsys, argv, out)
    assert line.startswith("error [non_finite_result]: the latent after step 1 of 3")
    assert f"of the LoRA {bad} holds NaN or infinite values" in line


def test_an_upscaler_with_nan_weights_names_its_tensor(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sdplan._ggml")
    from PIL import Image
    from pth_writer import compact_weights, save_compact

    weights = compact_weights()
    weights["body.6.bias"][0] = np.nan  # the last convolution: nothing after it to hide it
    up = save_compact(tmp_path / "up.pth", weights)
    pic = tmp_path / "in.png"
    Image.fromarray(np.full((16, 16, 3), 100, np.uint8)).save(pic)
    out = tmp_path / "o.png"
    line = failed(capsys, ["upscale", "-i", str(pic), "--upscale-model", str(up), "-o", str(out),
                           "-t", "1"], out)
    assert line == ("error [non_finite_result]: the upscaled picture holds NaN or infinite values "
                    f"(nothing was written); likely cause: weights: tensor 'body.6.bias' of {up} "
                    "holds NaN or infinite values")
