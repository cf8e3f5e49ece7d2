"""Model file sets the engine cannot run are refused from the headers, in one line naming the
flag and the file, by ``sdplan generate`` before its engine starts and by ``sdplan plan`` with
the same line (both run :func:`sdplan.core.modelfiles.file_roles.read_checked`):

1. a FLUX.1 autoencoder (16 latent channels) given with ``--vae`` to FLUX.2 klein, whose
   autoencoder is the 32-channel FLUX.2 one (the pipeline refused it once the engine had
   started: "not a FLUX.2 autoencoder: bn.running_mean ... missing");
2. an LLM whose hidden width is not what the DiT takes with ``--llm``: klein 9B's Qwen3-8B
   (4096) given to Z-Image (caption width 2560) or to klein 4B (3 states of 2560); the
   pipeline refused it after the engine started, in a line without its ``[code]``;
3. an autoencoder given as ``--diffusion-model`` or ``-m`` (it failed inside the engine as
   "no CLIP text encoder" / "not an SD checkpoint");
4. an autoencoder of the right latent channels in the other layout: FLUX.1's 2-D ``ae`` given
   to Qwen-Image or Wan, whose autoencoder is Wan 2.1's causal 3-D one, and Wan 2.1's given to
   Z-Image (all 16 channels; the pipeline refused it once the engine had started: "no Wan
   autoencoder: 'decoder.conv1.weight' and 'encoder.conv1.weight' missing").

The files are sparse real-size layouts from ``../shared/models`` (headers with the published
names and shapes, no data). Qwen3-8B has no layout there: it is Qwen3-4B's with Qwen3-8B's
published sizes (``Qwen/Qwen3-8B`` ``config.json``: hidden 4096, MLP 12288, 32 query heads and
8 key/value heads of 128, 36 layers; Qwen3-4B: 2560, 9728, the same heads and layers). The
expected widths and channels are read here from the layouts themselves, not from the readers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from generate_util import parse
from sparse_writer import write_sparse

Layout = dict[str, list[int]]
ERROR = "error [invalid_model_file]: "


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def qwen3_8b(qwen3_4b: Layout) -> Layout:
    """Qwen3-4B's names with Qwen3-8B's sizes (module docstring): hidden 2560 -> 4096, MLP
    9728 -> 12288; the attention projections' head rows (32 x 128, 8 x 128) stay."""
    return {n: [{2560: 4096, 9728: 12288}.get(d, d) for d in s] for n, s in qwen3_4b.items()}


@pytest.fixture(scope="module")
def files(layouts: dict[str, Layout], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sparse files: klein 4B, Z-Image Turbo, Qwen-Image and Wan 2.2 A14B DiTs, Qwen3-4B and
    -8B, Qwen2.5-VL-7B, UMT5-XXL, FLUX.1 ``ae``, the FLUX.2 and the Wan 2.1 autoencoders
    (published dtypes: bf16 DiTs and encoders, f32 autoencoders)."""
    root = tmp_path_factory.mktemp("sets")
    made = {"klein": ("flux-2-klein-4b.safetensors", layouts["flux2_klein_4b"], "BF16"),
            "z_image": ("z_image_turbo_bf16.safetensors", layouts["z_image_turbo"], "BF16"),
            "qwen3_4b": ("qwen_3_4b.safetensors", layouts["qwen3_4b_hf"], "BF16"),
            "qwen3_8b": ("qwen_3_8b.safetensors", qwen3_8b(layouts["qwen3_4b_hf"]), "BF16"),
            "ae": ("ae.safetensors", layouts["flux1_ae_bfl"], "F32"),
            "flux2_vae": ("flux2-vae.safetensors", layouts["flux2_vae"], "F32"),
            "qwen_image": ("qwen_image_bf16.safetensors", layouts["qwen_image_dit"], "BF16"),
            "qwen25vl": ("qwen_2.5_vl_7b.safetensors", layouts["qwen25vl_7b_llm"], "BF16"),
            "wan21_vae": ("wan_2.1_vae.safetensors", layouts["wan21_vae"], "F32"),
            "wan_a14b": ("wan2.2_t2v_low_noise_14B_bf16.safetensors", layouts["wan22_t2v_a14b"], "BF16"),
            "umt5": ("umt5_xxl_bf16.safetensors", layouts["umt5_xxl"], "BF16")}
    out = {}
    for key, (name, shapes, dtype) in made.items():
        out[key] = root / name
        write_sparse(out[key], shapes, dtype)
    return out


class EngineStarted(Exception):
    """Raised by the stand-in for the engine: the command got past every check."""


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdplan.core.runtime import process

    def start(*a: object, **k: object) -> None:
        raise EngineStarted

    monkeypatch.setattr(process.Engine, "__init__", start)


def refused(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``sdplan generate ARGV`` and ``sdplan plan ARGV``; both must exit 2 with the same one
    error line and nothing on stdout, the picture unwritten. Returns the line."""
    from sdplan.core.cli import main

    out = tmp_path / "x.png"
    args = parse([*argv, "-p", "a cat", "-o", str(out), "-t", "1"])
    assert args.run(args) == 2  # the engine stand-in raises EngineStarted if it is reached
    stdout, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and stdout == "" and not out.exists(), (stdout, err)
    assert main(["plan", *argv]) == 2
    plan_out, plan_err = capsys.readouterr()
    assert plan_err.splitlines() == lines and plan_out == "", (plan_out, plan_err)
    return lines[0]


def test_the_layouts_say_what_the_checks_compare(layouts: dict[str, Layout], files: dict[str, Path]) -> None:
    """The numbers the refusals name, from the layouts: klein 4B's text input is 3 x 2560
    (Qwen3-4B's states after blocks 9, 18, 27), Z-Image's caption width 2560; the FLUX.1
    autoencoder decodes 16 latent channels, FLUX.2's 32; and the readers agree."""
    from sdplan.core.modelfiles.file_sets import llm_width, vae_latent

    assert layouts["flux2_klein_4b"]["txt_in.weight"][1] == 3 * 2560
    assert layouts["z_image_turbo"]["cap_embedder.1.weight"][1] == 2560
    assert layouts["qwen3_4b_hf"]["model.layers.0.input_layernorm.weight"] == [2560]
    assert layouts["flux1_ae_bfl"]["decoder.conv_in.weight"][1] == 16
    assert layouts["flux2_vae"]["decoder.conv_in.weight"][1] == 32
    assert vae_latent(files["ae"]) == (16, 2) and vae_latent(files["flux2_vae"]) == (32, 2)
    assert llm_width(files["qwen3_4b"]) == (2560, 36, "qwen3, 36 blocks")
    assert llm_width(files["qwen3_8b"]) == (4096, 36, "qwen3, 36 blocks")
    assert llm_width(files["ae"]) is None and vae_latent(files["qwen3_4b"]) is None
    # Wan 2.1's causal autoencoder (Qwen-Image's too): FLUX.1's 16 channels, 3-D kernels
    assert layouts["wan21_vae"]["decoder.conv1.weight"] == [384, 16, 3, 3, 3]
    assert vae_latent(files["wan21_vae"]) == (16, 3)


def test_a_flux1_autoencoder_for_flux2_klein(files: dict[str, Path], tmp_path: Path, capsys, no_engine) -> None:
    line = refused(["--diffusion-model", str(files["klein"]), "--llm", str(files["qwen3_4b"]),
                    "--vae", str(files["ae"])], tmp_path, capsys)
    assert line == (f"{ERROR}{files['ae']}: --vae: a FLUX.1 or SD3 autoencoder (16 latent channels); "
                    "FLUX.2 klein needs the FLUX.2 autoencoder (32 latent channels)")


@pytest.mark.parametrize("dit,reads", [
    ("z_image", "Z-Image DiT reads one state of width 2560 (Qwen3-4B)"),
    ("klein", "FLUX.2 klein DiT reads 3 states of width 2560 (Qwen3-4B)"),
])
def test_an_llm_of_another_width(files: dict[str, Path], tmp_path: Path, capsys, no_engine, dit: str,
                                 reads: str) -> None:
    vae = files["ae"] if dit == "z_image" else files["flux2_vae"]
    line = refused(["--diffusion-model", str(files[dit]), "--llm", str(files["qwen3_8b"]), "--vae", str(vae)],
                   tmp_path, capsys)
    assert line == (f"{ERROR}{files['qwen3_8b']}: --llm: a language model of hidden width 4096 "
                    f"(qwen3, 36 blocks); this {reads}")


@pytest.mark.parametrize("flag,takes", [("--diffusion-model", "a diffusion model"),
                                        ("-m", "a checkpoint or a diffusion model")])
def test_an_autoencoder_as_the_diffusion_model(files: dict[str, Path], tmp_path: Path, capsys, no_engine,
                                               flag: str, takes: str) -> None:
    encoders = ["--llm", str(files["qwen3_4b"]), "--vae", str(files["ae"])] if flag != "-m" else []
    line = refused([flag, str(files["ae"]), *encoders], tmp_path, capsys)
    assert line == f"{ERROR}{files['ae']}: {flag} takes {takes}; this file holds an autoencoder"


@pytest.mark.parametrize("dit,encoder,vae,have,needs", [
    ("qwen_image", ("--llm", "qwen25vl"), "ae", "a FLUX.1 or SD3 autoencoder (16 latent channels, 2-D)",
     "Qwen-Image needs the Qwen-Image (Wan 2.1) autoencoder (16 latent channels, 3-D causal)"),
    ("wan_a14b", ("--t5xxl", "umt5"), "ae", "a FLUX.1 or SD3 autoencoder (16 latent channels, 2-D)",
     "Wan 2.x video needs the Wan 2.1 autoencoder (16 latent channels, 3-D causal)"),
    ("z_image", ("--llm", "qwen3_4b"), "wan21_vae", "the Wan 2.1 autoencoder (16 latent channels, 3-D causal)",
     "Z-Image needs the FLUX.1 autoencoder (16 latent channels, 2-D)"),
])
def test_an_autoencoder_of_the_other_layout(files: dict[str, Path], tmp_path: Path, capsys, no_engine, dit: str,
                                            encoder: tuple[str, str], vae: str, have: str, needs: str) -> None:
    line = refused(["--diffusion-model", str(files[dit]), encoder[0], str(files[encoder[1]]),
                    "--vae", str(files[vae])], tmp_path, capsys)
    assert line == f"{ERROR}{files[vae]}: --vae: {have}; {needs}"


@pytest.mark.parametrize("dit,llm,vae", [("klein", "qwen3_4b", "flux2_vae"), ("z_image", "qwen3_4b", "ae"),
                                         ("qwen_image", "qwen25vl", "wan21_vae")])
def test_the_published_sets_reach_the_engine(files: dict[str, Path], tmp_path: Path, capsys, no_engine,
                                             dit: str, llm: str, vae: str) -> None:
    """The checks refuse no set the engine runs: klein 4B with Qwen3-4B and the FLUX.2
    autoencoder, Z-Image with Qwen3-4B and FLUX.1's, Qwen-Image with Qwen2.5-VL-7B and Wan
    2.1's get to the engine's start."""
    args = parse(["--diffusion-model", str(files[dit]), "--llm", str(files[llm]), "--vae", str(files[vae]),
                  "-p", "a cat", "-o", str(tmp_path / "x.png"), "-t", "1"])
    with pytest.raises(EngineStarted):
        args.run(args)
    assert "error" not in capsys.readouterr().err


def test_two_diffusion_models_of_different_families(layouts: dict[str, Layout], files: dict[str, Path],
                                                    tmp_path: Path, capsys, no_engine) -> None:
    """A whole SDXL checkpoint given with ``-m`` beside FLUX.2 klein's ``--diffusion-model`` shares
    no tensor name with klein's files: read together they made one set planned as klein, and
    generate failed inside the engine. Both commands refuse it, naming both files."""
    sdxl = tmp_path / "sd_xl_base_1.0.safetensors"
    write_sparse(sdxl, layouts["sdxl_base_ldm_full"], "F16")
    line = refused(["-m", str(sdxl), "--diffusion-model", str(files["klein"]), "--llm", str(files["qwen3_4b"]),
                    "--vae", str(files["flux2_vae"])], tmp_path, capsys)
    assert line == (f"{ERROR}{files['klein']}: --diffusion-model: the diffusion model of FLUX.2 klein, where -m "
                    f"{sdxl} holds that of SDXL: give the files of one model")
