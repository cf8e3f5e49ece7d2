"""Built-in model profiles: sizes against the real published files, consistency, and
``sdplan plan --model-profile``.

Published sizes (bytes, as the Hugging Face file listings give them; the same figures are
pinned by many public download manifests, e.g. the "Flux_package" file lists and the
SDXL/Flux asset tables that record publisher tree-API sizes):

- black-forest-labs/FLUX.1-dev ``flux1-dev.safetensors`` 23,802,932,552 (BF16)
- black-forest-labs/FLUX.1-dev ``ae.safetensors`` 335,304,388 (F32)
- comfyanonymous/flux_text_encoders ``t5xxl_fp16.safetensors`` 9,787,841,024
- comfyanonymous/flux_text_encoders ``clip_l.safetensors`` 246,144,152
- stabilityai/stable-diffusion-xl-base-1.0 ``sd_xl_base_1.0.safetensors`` 6,938,078,334
- stable-diffusion-v1-5/stable-diffusion-v1-5 ``v1-5-pruned-emaonly.safetensors``
  4,265,146,304 (every tensor F32)
- city96/FLUX.1-dev-gguf ``flux1-dev-Q4_0.gguf`` 6,791,167,136
- city96/FLUX.1-schnell-gguf ``flux1-schnell-Q4_0.gguf`` 6,770,707,360
- lodestones/Chroma1-HD ``Chroma1-HD.safetensors`` "17.8 GB" (BF16; the listing rounds to
  0.1 GB, so the bound here is that rounding, 0.3%), 8.9 B parameters on its model card

Tolerances: a safetensors file is its tensors plus an 8-byte length and a JSON header of
tens of KiB (and, in full checkpoints, a few small buffers sdplan does not load), so the
profile must be within 0.5% of the file. A GGUF file adds its key/value metadata, tensor
infos and 32-byte alignment padding per tensor, and city96's files were quantised with a
patched llama-quantize whose keep-in-F16/F32 name list changed across versions (which
embedder matrices stay 16-bit moves tens of MiB), so the bound is 1%.
"""

from __future__ import annotations

import json
import math

import pytest
from sdplan.core.cli import main
from sdplan.core.errors import ModelFileError
from sdplan.core.planning.builtin_profiles import list_profiles, load_builtin_profile, profile_names

SAFETENSORS_TOL = 0.005
GGUF_TOL = 0.01


def _close(got: int, want: int, tol: float) -> None:
    assert abs(got - want) <= tol * want, f"{got:,} vs {want:,} ({(got - want) / want:+.3%})"


def _file(name: str, file: str) -> int:
    info = {i.name: i for i in list_profiles()}[name]
    return info.files[file]


@pytest.mark.parametrize("got, want, tol", [
    (lambda: load_builtin_profile("flux1-dev-f16").modules["diffusion"].total,
     23_802_932_552, SAFETENSORS_TOL),
    (lambda: load_builtin_profile("flux1-dev-f16").modules["vae"].total,
     335_304_388, SAFETENSORS_TOL),
    (lambda: load_builtin_profile("flux1-dev-f16").modules["te"].encoders["t5xxl"],
     9_787_841_024, SAFETENSORS_TOL),
    (lambda: load_builtin_profile("flux1-schnell-f16").modules["te"].encoders["clip_l"],
     246_144_152, SAFETENSORS_TOL),
    (lambda: sum(m.total for m in load_builtin_profile("sdxl-base-f16").modules.values()),
     6_938_078_334, SAFETENSORS_TOL),
    # The published SD 1.5 file is F32: twice the F16 profile's bytes.
    (lambda: 2 * sum(m.total for m in load_builtin_profile("sd15-f16").modules.values()),
     4_265_146_304, SAFETENSORS_TOL),
    (lambda: load_builtin_profile("flux1-dev-q4_0").modules["diffusion"].total,
     6_791_167_136, GGUF_TOL),
    (lambda: load_builtin_profile("flux1-schnell-q4_0").modules["diffusion"].total,
     6_770_707_360, GGUF_TOL),
    (lambda: load_builtin_profile("chroma1-hd-f16").modules["diffusion"].total,
     17_800_000_000, 0.003),
], ids=["flux1-dev.safetensors", "ae.safetensors", "t5xxl_fp16.safetensors",
        "clip_l.safetensors", "sd_xl_base_1.0.safetensors", "v1-5-pruned-emaonly.safetensors",
        "flux1-dev-Q4_0.gguf", "flux1-schnell-Q4_0.gguf", "Chroma1-HD.safetensors"])
def test_sizes_match_published_files(got, want, tol) -> None:
    _close(got(), want, tol)


def test_file_table_matches_modules() -> None:
    """The per-file table shipped with a profile adds up to its modules, but for the LLM blocks
    a family never reads (in the files, not loaded: FLUX.2 klein and dev, Z-Image; their exact
    bytes in the families' tests)."""
    for info in list_profiles():
        unread = sum(info.files.values()) - info.total_bytes
        reads_some = info.architecture.startswith(("flux2", "z_image"))
        assert unread > 10**8 if reads_some else unread == 0, info.name
    assert _file("flux1-dev-f16", "flux1-dev.safetensors") == load_builtin_profile(
        "flux1-dev-f16").modules["diffusion"].total


def test_quant_ratios_follow_ggml_block_sizes() -> None:
    """Quantised Flux sizes against an independent model of the format: the quantised weights at
    ggml's bytes per weight (Q8_0 34/32, Q5_K 176/256, Q4_0 18/32), everything else
    unchanged, so size(q) - size(q') is the block weights' element count times the
    difference of bytes per weight."""
    dev = {q: load_builtin_profile(f"flux1-dev-{q}").modules["diffusion"].total
           for q in ("q8_0", "q5_k", "q4_0")}
    n8_4 = (dev["q8_0"] - dev["q4_0"]) / (34 / 32 - 18 / 32)
    n8_5 = (dev["q8_0"] - dev["q5_k"]) / (34 / 32 - 176 / 256)
    assert math.isclose(n8_4, n8_5, rel_tol=1e-9)
    assert 11.7e9 < n8_4 < 11.95e9  # FLUX.1 has 11.9 B parameters, nearly all in blocks


@pytest.mark.parametrize("model, blocks", [
    ("flux1-dev", 57), ("flux1-schnell", 57), ("sd35-large", 38), ("sd35-medium", 24),
    ("sd15", 0), ("sd21", 0), ("sdxl-base", 0)])
def test_block_counts(model: str, blocks: int) -> None:
    for quant in ("f16", "q8_0", "q5_k", "q4_k", "q4_0"):
        p = load_builtin_profile(f"{model}-{quant}")
        assert len(p.modules["diffusion"].blocks) == blocks
        assert all(b > 0 for b in p.modules["diffusion"].blocks)
        assert set(p.modules) == {"diffusion", "te", "vae"}


@pytest.mark.parametrize("model, encoders, block_encoder, te_blocks", [
    ("flux1-dev", {"clip_l", "t5xxl"}, "t5xxl", 24),
    ("sd35-large", {"clip_l", "clip_g", "t5xxl"}, "t5xxl", 24),
    ("sdxl-base", {"clip_l", "clip_g"}, "clip_g", 32),
    ("sd15", {"clip_l"}, "clip_l", 12),
    ("sd21", {"clip_h"}, "clip_h", 24)])
def test_text_encoders(model: str, encoders: set, block_encoder: str, te_blocks: int) -> None:
    p = load_builtin_profile(f"{model}-f16")
    te = p.modules["te"]
    assert set(te.encoders) == encoders
    assert te.block_encoder == block_encoder
    assert len(te.blocks) == te_blocks
    assert sum(te.encoders.values()) == te.total


def test_clip_l_is_the_same_tower_everywhere() -> None:
    """CLIP-L inside the SD 1.5 checkpoint and the standalone clip_l.safetensors hold the
    same tensors (within a few small buffers)."""
    sd15 = load_builtin_profile("sd15-f16").modules["te"]
    flux = load_builtin_profile("flux1-dev-f16").modules["te"]
    assert sd15.encoders["clip_l"] - flux.encoders["clip_l"] in range(0, 1024)


def test_t5_q8_0_against_f16() -> None:
    """T5-XXL Q8_0 drops the tied embedding copy and stores matrices at 34/32 bytes per
    weight against 2: between 0.5 and 0.55 of F16."""
    f16 = load_builtin_profile("flux1-dev-f16").modules["te"].encoders["t5xxl"]
    q8 = load_builtin_profile("flux1-dev-q8_0").modules["te"].encoders["t5xxl"]
    assert 0.5 < q8 / f16 < 0.55


def test_names_and_typos() -> None:
    names = profile_names()
    assert len(names) == 80 and len(set(names)) == 80
    for n in ("flux1-dev-q8_0", "sd15-f16", "sdxl-base-q4_k", "sd35-large-q5_k"):
        assert n in names
    assert load_builtin_profile("FLUX1-DEV-Q8_0").name == "flux1-dev-q8_0"
    with pytest.raises(ModelFileError, match="flux1-dev-q8_0"):
        load_builtin_profile("flux1-dev-q8")
    with pytest.raises(ModelFileError, match="no built-in model profile"):
        load_builtin_profile("zzzz")


def test_architectures() -> None:
    arch = {i.name: i.architecture for i in list_profiles()}
    assert arch["flux1-dev-q8_0"] == "flux-dev"
    assert arch["flux1-schnell-f16"] == "flux-schnell"
    assert arch["sd35-large-f16"] == "sd3-large"
    assert arch["sd35-medium-f16"] == "sd3-3.5-medium"
    assert arch["sdxl-base-f16"] == "sdxl"
    assert arch["sd21-f16"] == "sd2"
    assert arch["sd15-f16"] == "sd1"
    assert arch["chroma1-hd-q8_0"] == "chroma"


def test_chroma_has_t5_only_and_flux_blocks() -> None:
    """Chroma1-HD: FLUX.1's 19 + 38 blocks without their modulation, T5-XXL alone, FLUX.1's
    autoencoder; its approximator (8.9 B - 8.6 B parameters) counts as non-block bytes."""
    chroma, flux = load_builtin_profile("chroma1-hd-f16"), load_builtin_profile("flux1-dev-f16")
    d = chroma.modules["diffusion"]
    assert len(d.blocks) == 57
    assert d.blocks[0] == flux.modules["diffusion"].blocks[0] - 2 * 2 * (3072 * 6 * 3072 + 6 * 3072)
    assert d.blocks[19] == flux.modules["diffusion"].blocks[19] - 2 * (3072 * 3 * 3072 + 3 * 3072)
    assert chroma.modules["te"].encoders == {"t5xxl": flux.modules["te"].encoders["t5xxl"]}
    assert chroma.modules["vae"].total == flux.modules["vae"].total
    approx = 64 * 5120 + 5120 + 5 * (2 * (5120 * 5120 + 5120) + 5120) + 5120 * 3072 + 3072
    assert d.other == 2 * (approx + 3072 * 64 + 3072 + 3072 * 4096 + 3072 + 64 * 3072 + 64)


def test_plan_model_profile_gives_ranges(shared_dir, capsys) -> None:
    rc = main(["plan", "--model-profile", "flux1-dev-q8_0", "--devices",
               str(shared_dir / "cases" / "devices" / "D1.json"), "--backend",
               "diffusion=CUDA0&CUDA1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    ranges = out["modules"]["diffusion"]["ranges"]
    assert [r["device"] for r in ranges] == ["CUDA0", "CUDA1"]
    assert ranges[0]["first_block"] == 0 and ranges[-1]["last_block"] == 56
    blocks = load_builtin_profile("flux1-dev-q8_0").modules["diffusion"].blocks
    assert sum(r["bytes"] for r in ranges) == sum(blocks)


def test_plan_model_profile_conflicts(capsys) -> None:
    rc = main(["plan", "--model-profile", "sd15-f16", "--profile", "x.json", "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert rc == 2 and err["code"] == "conflicting_model_sources"
    rc = main(["plan", "--model-profile", "sd15-f1", "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert rc == 2 and "sd15-f16" in err["message"]


def test_plan_model_profile_list(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "--model-profile", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == profile_names()
    assert all(r["bytes"] == sum(r["modules"].values()) for r in rows)
    assert main(["plan", "--model-profile", "list"]) == 0
    text = capsys.readouterr().out
    assert "total GiB" in text
    for info in list_profiles():
        assert f"{info.name} " in text
        assert f"{info.total_bytes / 2**30:.2f}" in text


def test_piped_profile_list_is_not_cut(capsys, monkeypatch) -> None:
    """Not a terminal and no COLUMNS: model names and architectures still print whole."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["plan", "--model-profile", "list"]) == 0
    text = capsys.readouterr().out
    for info in list_profiles():
        assert f" {info.title} " in text and f" {info.architecture} " in text
