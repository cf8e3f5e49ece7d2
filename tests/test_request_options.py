"""Every family that runs, every generation option, every sampler and every scheduler: each is
honoured or refused, never dropped.

A table over the registry's families (SD 1.x on the demo model, SD 2.x, SDXL, SD3, FLUX.1 dev,
Chroma, Z-Image, FLUX.2 klein, FLUX.2 dev, Qwen-Image, Wan text to video and Wan 2.2 I2V-A14B
image to video (the Wan family's ``i2v_a14b`` variant, its own options: a start picture in
every request), Wan 2.2 TI2V-5B (``ti2v_5b``: ``-i`` honoured, the picture as the first latent
frame) on their tiny fixtures) and every option of
:data:`sdplan.core.families.options.OPTIONS`. Where the family declares an option honoured,
the engine job (:func:`sdplan.core.pipelines.jobs.generate_job`, in this process) runs the
request with the option at a value other than its default, in a setting where it matters
(``--eta`` with an ancestral sampler, the negative prompt with CFG...), and the picture must
differ from the same request without it (its previews for ``--taesd`` alone, which only
previews) while the result's ``params`` state the value. Where the family does not honour
it, the request is refused before anything loads: the family's ``generate`` and the plan's
device check are replaced by functions that fail the test, and the refusal is one line naming
the option's flag and the family's title. Every sampler and scheduler is run the same way
(the picture differs from the family's default and ``params`` name it), or refused by name.

Sizes are tiny and runs take 2 or 3 steps; the engine keeps each family's pipeline loaded
between requests with the same files and placements, so a family's model set loads about
once per file set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from PIL import Image  # noqa: E402
from sdplan.core.errors import InvalidArgument  # noqa: E402
from sdplan.core.families import Family  # noqa: E402
from sdplan.core.families import family as registry_family  # noqa: E402
from sdplan.core.families import options as o  # noqa: E402
from sdplan.core.pipelines import jobs  # noqa: E402
from sdplan.core.runtime.process import JobContext  # noqa: E402
from sdplan.core.runtime.runner import CancelToken  # noqa: E402
from sdplan.core.sampling.names import SAMPLERS, SCHEDULES, samplers_for, schedulers_for  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures"
PROMPT = "a photo of a cat"
#: The rows: the registry families that run, each on its tiny model set.
ROWS = ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "z_image", "flux2_klein", "flux2", "qwen_image",
        "wan", "wan_i2v", "wan_ti2v")
#: Rows that run a family's variant: row -> (family, variant).
VARIANT_ROWS = {"wan_i2v": ("wan", "i2v_a14b"), "wan_ti2v": ("wan", "ti2v_5b")}
#: Wan's tiny model set (the low-noise expert alone; the option adds the high-noise one).
WAN = {"diffusion_model": [str(FIX / "wan_tiny.safetensors")], "t5xxl": [str(FIX / "umt5_tiny.safetensors")],
       "vae": [str(FIX / "wan_vae_tiny.safetensors")]}
WAN_I2V = {**WAN, "diffusion_model": [str(FIX / "wan_i2v_tiny.safetensors")]}
#: Wan 2.2 TI2V-5B's (the 48-channel DiT, the Wan 2.2 autoencoder: 16x, sizes of 32).
WAN_TI2V = {"diffusion_model": [str(FIX / "wan_ti2v_tiny.safetensors")],
            "t5xxl": [str(FIX / "umt5_tiny.safetensors")], "vae": [str(FIX / "wan22_vae_tiny.safetensors")]}


@dataclass
class Row:
    """One family's model set and request basics."""

    files: dict[str, list[str]]
    size: int
    overrides: dict[str, Any] = field(default_factory=dict)
    tae: str = ""
    lora: str = ""
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Change:
    """An option set away from its default: ``change`` (request keys, ``files`` extra model
    files) on top of ``context`` (what makes it matter), and what ``params`` must then hold.
    ``check``: ``image`` (the picture differs), ``previews`` (the previews differ),
    ``batch`` (two different pictures), ``size`` (a larger picture), ``vae_scale`` (the
    loaded SDXL VAE graph's convolution scale), ``frames`` (a video's five frames)."""

    change: dict[str, Any]
    recorded: dict[str, Any]
    context: dict[str, Any] = field(default_factory=dict)
    check: str = "image"


def _png(path: Path, array: np.ndarray) -> str:
    Image.fromarray(array).save(path)
    return str(path)


def _lora(path: Path, files: dict[str, list[str]]) -> str:
    """A kohya LoRA file patching the largest 2-D weight of the diffusion model that the
    model set's LoRA names reach (:func:`sdplan.core.modelfiles.lora.model_aliases`)."""
    from safetensors.numpy import save_file
    from sdplan.core.modelfiles.checkpoint import read_model_files
    from sdplan.core.modelfiles.lora import model_aliases

    ms = read_model_files(files)
    shapes = {t.info.name: tuple(t.info.shape) for t in ms.tensors}
    table = model_aliases(ms)["unet"]
    alias, target = max(((a, t) for a, t in table.items() if t.rows is None and len(shapes[t.tensor]) == 2),
                        key=lambda at: (np.prod(shapes[at[1].tensor]), at[0]))
    out, inp = shapes[target.tensor]
    rng = np.random.default_rng(5)
    key = "lora_unet_" + alias.replace(".", "_")
    save_file({f"{key}.lora_down.weight": rng.standard_normal((2, inp)).astype(np.float32),
               f"{key}.lora_up.weight": rng.standard_normal((out, 2)).astype(np.float32)}, str(path))
    return path.stem


def _autoencoder_x8(src: Path, dst: Path) -> str:
    """The toy 16-channel autoencoder (two levels: it halves) grown to four levels, so it
    divides by 8 as the pipelines' latent size assumes: level 1 of the decoder (blocks and
    upsample) and level 0 of the encoder (blocks and downsample) repeated. Random weights
    either way: what counts is that a request's pictures have the sizes of a real model's."""
    from safetensors.numpy import load_file, save_file

    t = load_file(str(src))
    out = {k: v for k, v in t.items() if not k.startswith("encoder.down.1.")}
    for k, v in t.items():
        for part, level, copies in (("decoder.up.", "1", ("2", "3")), ("encoder.down.", "0", ("1", "2"))):
            if k.startswith(part + level + "."):
                out.update({part + c + k[len(part) + 1:]: v for c in copies})
        if k.startswith("encoder.down.1."):
            out["encoder.down.3." + k[len("encoder.down.1."):]] = v
    save_file(out, str(dst))
    return str(dst)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, Any]:
    """The rows' model sets and the inputs the options need, written once."""
    import flux2_dev_util
    import flux2_util
    import flux_util
    import qwen_image_util
    import sd3_util
    import sdxl_util
    import zimage_util
    from pth_writer import compact_weights
    from safetensors.numpy import load_file, save_file
    from sdplan.core.pipelines.demo.model import demo_lora_dir, demo_model_path
    from test_models_tae import tae_weights

    d = tmp_path_factory.mktemp("options")
    sd2 = d / "sd2_tiny.safetensors"
    save_file(load_file(str(FIX / "sd2_tiny.safetensors")), str(sd2),
              metadata={"sdplan.family": "sd2", "sdplan.clip_heads": "2", "sdplan.unet_head_dim": "8"})
    (d / "sdxl").mkdir()
    ae = _autoencoder_x8(flux_util.AE, d / "flux_ae_x8.safetensors")
    rows = {
        "sd1": Row({"model": [str(demo_model_path())]}, 32),
        "sd2": Row({"model": [str(sd2)]}, 16),
        "sdxl": Row({"model": [str(sdxl_util.BASE)]}, 16),
        "sd3": Row({"diffusion_model": [str(sd3_util.SD3)], "clip_l": [str(sd3_util.CLIP_L)],
                    "clip_g": [str(sd3_util.CLIP_G)], "t5xxl": [str(sd3_util.T5)], "vae": [str(sd3_util.SD3)]}, 16,
                   {"clip_heads": 2}),
        "flux": Row({"diffusion_model": [str(flux_util.DEV)], "t5xxl": [str(flux_util.T5)],
                     "clip_l": [str(flux_util.CLIP)], "vae": [ae]}, 32,
                    {"clip_heads": 2, "flux_axes": [4, 6, 6], "t5_length": 16}),
        "chroma": Row({"diffusion_model": [str(flux_util.CHROMA)], "t5xxl": [str(flux_util.T5)],
                       "vae": [ae]}, 32, {"flux_axes": [4, 6, 6], "t5_length": 16}),
        "z_image": Row({"diffusion_model": [str(zimage_util.DIT)],
                        "llm": [str(zimage_util.write_qwen3(d / "qwen3_tiny.safetensors"))],
                        "vae": [ae]}, 32),
        "flux2_klein": Row({"diffusion_model": [str(flux2_util.DIT)],
                            "llm": [str(flux2_util.write_llm(d / "qwen3_klein.safetensors"))],
                            "vae": [str(flux2_util.AE)]}, 32),
        "flux2": Row({"diffusion_model": [str(flux2_dev_util.DIT)],
                      "llm": [str(flux2_dev_util.write_llm(d / "mistral_flux2.safetensors"))],
                      "vae": [str(flux2_dev_util.AE)]}, 32),
        "qwen_image": Row(qwen_image_util.files(), 32),
        "wan": Row(WAN, 32),
        "wan_i2v": Row(WAN_I2V, 32),
        "wan_ti2v": Row(WAN_TI2V, 32),
    }
    rng = np.random.default_rng(3)
    for channels in (4, 16, 32):
        save_file(tae_weights(rng, "decoder", channels), str(d / f"tae{channels}.safetensors"))
    for name, row in rows.items():
        fam = registry_family(VARIANT_ROWS.get(name, (name, None))[0])
        assert fam is not None
        row.tae = str(d / f"tae{fam.companions.latent_channels}.safetensors")
        if name == "sd1":
            row.lora = "outline"
        elif fam.honours(o.LORA):
            (d / name).mkdir(exist_ok=True)
            row.lora = _lora(d / name / f"style_{name}.safetensors", row.files)
    save_file(compact_weights(feat=4, n_conv=1), str(d / "up_x2.safetensors"))
    from controlnet_util import controlnet_from_unet

    controlnets = {name: controlnet_from_unet(row.files["model"][0], d / f"controlnet_{name}.safetensors")
                   for name, row in rows.items() if fam_of(name).honours(o.CONTROL, variant_of(name))}
    pic = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    mask = np.zeros((32, 32), np.uint8)
    mask[:, 16:] = 255
    Image.fromarray(mask).save(d / "mask.png")
    rows["wan_i2v"].settings = {"init_img": _png(d / "start.png", pic[::-1].copy())}  # its start picture
    return {"rows": rows, "dir": d, "sdxl_vae": sdxl_util.split_files(d / "sdxl")["vae"], "lora_dirs": {n: str(demo_lora_dir() if n == "sd1" else d / n) for n in rows},
            "upscaler": str(d / "up_x2.safetensors"), "picture": _png(d / "picture.png", pic),
            "controlnets": controlnets,
            "mask": str(d / "mask.png")}


class Runs:
    """Engine jobs in this process, each request run once."""

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self.done: dict[str, dict[str, Any]] = {}

    def request(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        row = self.env["rows"][name]
        extra = dict(settings)
        files = {**row.files, **extra.pop("files", {})}
        return {"model_files": files, "prompt": PROMPT, "width": row.size, "height": row.size, "steps": 2,
                "seed": 1, "threads": 1, "previews": False, "overrides": row.overrides, **row.settings, **extra}

    def run(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        req = self.request(name, settings)
        key = json.dumps(req, sort_keys=True, default=str)
        if key not in self.done:
            previews: list[np.ndarray] = []

            def emit(kind: str, payload: Any) -> None:
                if kind == "preview":
                    previews.append(payload["image"])

            res = jobs.generate_job(JobContext(emit, CancelToken()), req)
            pipe = getattr(jobs.loaded_pipeline(), "sd", None)
            self.done[key] = {**res, "previews": previews, "vae_scale": getattr(pipe, "vae_conv_scale", None)}
        return self.done[key]


@pytest.fixture(scope="module")
def runs(env) -> Runs:
    return Runs(env)


def fam_of(name: str) -> Family:
    """The registry family row ``name`` runs."""
    fam = registry_family(VARIANT_ROWS.get(name, (name, None))[0])
    assert fam is not None and fam.runs, name
    return fam


def variant_of(name: str) -> str | None:
    """The variant row ``name`` runs (None: the family's options)."""
    return VARIANT_ROWS.get(name, (name, None))[1]


def change_of(opt: str, name: str, env: dict[str, Any]) -> Change:
    """The change that sets ``opt`` for row ``name`` (module docstring)."""
    fam = fam_of(name)
    d = fam.defaults
    row = env["rows"][name]
    flow = fam.sampling == "flow"
    cfg = {"cfg_scale": 3.0} if d.cfg_scale == 1.0 else {}  # the negative prompt works with CFG
    ancestral = {"sampling_method": "euler_a"}
    if opt == o.NEGATIVE_PROMPT:
        return Change({"negative_prompt": "a photo"}, {"negative_prompt": "a photo"}, cfg)
    if opt == o.CFG_SCALE:
        value = 3.0 if d.cfg_scale != 3.0 else 5.0
        return Change({"cfg_scale": value}, {"cfg_scale": value}, {"negative_prompt": "a photo"})
    if opt == o.GUIDANCE:
        return Change({"guidance": 6.0}, {"guidance": 6.0})
    if opt == o.CLIP_SKIP:
        skip = 2 if d.clip_skip == 1 else 1
        return Change({"clip_skip": skip}, {"clip_skip": skip})
    if opt == o.BATCH:
        return Change({"batch_count": 2}, {"batch_count": 2}, check="batch")
    if opt == o.ETA:
        return Change({"eta": 0.3}, {"eta": 0.3}, ancestral)
    if opt == o.SIGMAS:
        sigmas = [1.0, 0.4, 0.0] if flow else [10.0, 2.0, 0.0]
        return Change({"sigmas": sigmas}, {"sigmas": sigmas})
    if opt == o.FLOW_SHIFT:
        # FLUX.1, Chroma and FLUX.2's own schedules (sd-cli's flux / flux2 schedulers) take no
        # shift: it acts on the t-based schedulers, as in sd-cli
        own = name in ("flux", "chroma", "flux2_klein", "flux2")
        return Change({"flow_shift": 6.0}, {"flow_shift": 6.0}, {"scheduler": "discrete"} if own else {})
    if opt == o.TIMESTEP_SHIFT:
        return Change({"timestep_shift": 300}, {"timestep_shift": 300})
    if opt == o.RNG:
        return Change({"rng": "cpu"}, {"rng": "cpu"})
    if opt == o.SAMPLER_RNG:
        return Change({"sampler_rng": "cpu"}, {"sampler_rng": "cpu"}, ancestral)
    if opt == o.EXTRA_SAMPLE_ARGS:
        return Change({"extra_sample_args": "alpha=0.3,beta=0.4"}, {"extra_sample_args": {"alpha": "0.3", "beta": "0.4"}},
                      {"scheduler": "beta"})
    if opt == o.SLG:
        slg = {"slg_scale": 2.5, "skip_layers": "[1]", "skip_layer_start": 0.0, "skip_layer_end": 1.0}
        return Change(slg, {"slg_scale": 2.5})
    if opt == o.LORA:
        tag = f"<lora:{row.lora or 'style'}:1>"
        return Change({"prompt": PROMPT + tag}, {"prompt": PROMPT + tag},
                      {"lora_model_dir": env["lora_dirs"][name]})
    if opt == o.INIT_IMG and name in ("wan_i2v", "wan_ti2v"):  # a start picture (I2V: another than the row's), no strength
        return Change({"init_img": env["picture"]}, {"init_img": env["picture"]})
    if opt == o.INIT_IMG:  # 4 steps: sd-cli's truncated schedule then starts below sigma max
        return Change({"init_img": env["picture"], "strength": 0.5}, {"init_img": env["picture"], "strength": 0.5},
                      {"steps": 4})
    if opt == o.MASK:
        return Change({"mask": env["mask"]}, {"mask": env["mask"]},
                      {"init_img": env["picture"], "strength": 0.5, "steps": 4})
    if opt == o.REF_IMAGES:
        return Change({"ref_images": [env["picture"]]}, {"ref_images": [env["picture"]]})
    if opt == o.TAESD:
        return Change({"files": {"taesd": [row.tae]}}, {}, {"previews": True}, check="previews")
    if opt == o.TAESD_DECODE:
        return Change({"taesd_decode": True}, {"taesd_decode": True}, {"files": {"taesd": [row.tae]}})
    if opt == o.VAE_TILING:  # 64 px: a latent larger than sd-cli's smallest tile (4 latent pixels)
        tiling = {"enabled": True, "tile_px": [8, 8], "overlap": 0.5, "relative": None}  # 4 latent px at least
        return Change({"vae_tiling": tiling}, {"vae_tiling": tiling}, {"width": 64, "height": 64})
    if opt == o.UPSCALE:
        return Change({"files": {"upscale_model": [env["upscaler"]]}},
                      {"upscale_model": env["upscaler"], "upscale_repeats": 1}, check="size")
    if opt == o.CONTROL:
        net = env["controlnets"].get(name, str(env["dir"] / "control.safetensors"))
        return Change({"control_net": net, "control_image": env["picture"]}, {"control_net": net})
    if opt == o.HIRES:  # 32 px -> 64 (a multiple of sd-cli's 64 for the UNets)
        hires = {"enabled": True, "upscaler": "Latent", "scale": 2.0, "width": 0, "height": 0, "steps": 0,
                 "denoising_strength": 0.7, "upscalers_dir": None}
        return Change({"hires": hires}, {"hires": hires}, {"width": 32, "height": 32}, check="size")
    if opt == o.VAE_CONV_SCALE:
        # the checkpoint's own VAE is always scaled (sd-cli's rule): the flag acts on a --vae
        # file. Scaling by 1/32 and back is exact in floating point (an f16 overflow guard), so
        # the pipeline's VAE graph is what shows it: check "vae_scale"
        return Change({"force_sdxl_vae_conv_scale": True}, {"force_sdxl_vae_conv_scale": True},
                      {"files": {"vae": env["sdxl_vae"]}}, check="vae_scale")
    if opt == o.VIDEO:  # five frames of two latent frames, at 8 frames per second
        video = {"mode": "vid_gen", "video_frames": 5, "fps": 8}
        return Change(video, video, check="frames")
    if opt == o.HIGH_NOISE:  # the high-noise expert for the steps above the boundary, its own CFG
        expert = {"wan_i2v": "wan_i2v_high_noise_tiny", "wan_ti2v": "wan_ti2v_tiny"}.get(
            name, "wan_high_noise_tiny")  # an expert of the DiT's layout
        return Change({"files": {"high_noise_diffusion_model": [str(FIX / f"{expert}.safetensors")]},
                       "high_noise_cfg_scale": 4.0}, {"high_noise_cfg_scale": 4.0})
    raise AssertionError(f"no change written for option {opt}")


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if "files" in a and "files" in b:
        out["files"] = {**a["files"], **b["files"]}
    return out


def _refused(runs: Runs, name: str, settings: dict[str, Any], monkeypatch) -> str:
    """The one-line refusal of ``settings`` for row ``name``; fails when anything loads."""
    def loaded(*a: Any, **k: Any) -> Any:
        raise AssertionError("the request was not refused before loading")

    monkeypatch.setattr(jobs, "_pipeline", loaded)
    monkeypatch.setattr(jobs, "_plan", loaded)
    with pytest.raises(InvalidArgument) as exc:
        jobs.generate_job(JobContext(lambda *a: None, CancelToken()), runs.request(name, settings))
    text = str(exc.value)
    assert "\n" not in text and fam_of(name).title in text, text
    return text


def _differs(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) != len(b) or any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_rows_run_their_families(runs) -> None:
    """Each row's files are recognised as its family and run at its defaults."""
    for name in ROWS:
        res = runs.run(name, {})
        family, variant = VARIANT_ROWS.get(name, (name, None))
        assert res["params"]["architecture"].split("-")[0] == family
        assert variant is None or res["params"]["architecture"] == f"{family}-{variant}"
        fam = fam_of(name)
        assert res["params"]["cfg_scale"] == fam.defaults.cfg_scale
        assert res["params"]["sampling_method"] == fam.defaults.sampling_method
        assert len(res["images"]) == 1 and res["images"][0].dtype == np.uint8


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("opt", sorted(o.OPTIONS))
def test_every_option_is_honoured_or_refused(name: str, opt: str, env, runs, monkeypatch) -> None:
    fam = fam_of(name)
    c = change_of(opt, name, env)
    if not fam.honours(opt, variant_of(name)):  # the final decode with --taesd is an option only beside a --taesd file
        text = _refused(runs, name, _merged(c.context, c.change) if opt == o.TAESD_DECODE else c.change, monkeypatch)
        assert o.OPTIONS[opt] in text, text
        return
    base = runs.run(name, c.context)
    got = runs.run(name, _merged(c.context, c.change))
    for key, value in c.recorded.items():
        assert got["params"].get(key) == value, (key, got["params"].get(key))
    if opt == o.LORA:
        row = env["rows"][name]
        assert [(lo["name"], lo["weight"]) for lo in got["params"]["loras"]] == [(row.lora, 1.0)]
        assert got["params"]["loras"][0]["patched"] >= 1
    if c.check == "previews":
        assert base["previews"] and _differs(got["previews"], base["previews"])
        assert not _differs(got["images"], base["images"])  # previews only
    elif c.check == "batch":
        assert len(got["images"]) == 2 and _differs(got["images"][:1], got["images"][1:])
    elif c.check == "vae_scale":
        from sdplan.core.models.vae import SDXL_CONV_SCALE

        assert (base["vae_scale"], got["vae_scale"]) == (1.0, SDXL_CONV_SCALE)
    elif c.check == "frames":
        assert (len(base["images"]), len(got["images"])) == (1, 5)
        assert got["params"]["video"] == {"frames": 5, "fps": 8}
    elif c.check == "size":
        assert got["images"][0].shape[0] == 2 * base["images"][0].shape[0]
    else:
        assert _differs(got["images"], base["images"]), f"{opt} changed nothing for {fam.title}"


def _sampling_context(fam: Family) -> dict[str, Any]:
    """Three steps (multistep samplers differ from euler from the second on) and CFG on (the
    CFG++ samplers differ from their plain forms only with an unconditional pass)."""
    return {"steps": 3, **({"cfg_scale": 3.0} if fam.defaults.cfg_scale == 1.0 else {})}


#: Samplers that are the default sampler by construction: on a flow model sd-cli's
#: ``ddim_trailing`` is the flow's ancestral step with eta 0, which is Euler's step exactly.
SAME_AS_DEFAULT = {"flow": {"ddim_trailing"}, "discrete": set()}


@pytest.mark.parametrize("name", ROWS)
def test_every_sampler_runs_or_is_refused(name: str, runs, monkeypatch) -> None:
    fam = fam_of(name)
    ctx = _sampling_context(fam)
    base = runs.run(name, ctx)
    runnable = samplers_for(fam.sampling)
    same = set()
    for sampler in (*SAMPLERS, "ddim"):
        if sampler not in runnable:
            text = _refused(runs, name, {**ctx, "sampling_method": sampler}, monkeypatch)
            assert f"--sampling-method {sampler}: {fam.title} does not run it" in text
            monkeypatch.undo()
            continue
        got = runs.run(name, {**ctx, "sampling_method": sampler})
        assert got["params"]["sampling_method"] == sampler
        if sampler != fam.defaults.sampling_method and not _differs(got["images"], base["images"]):
            same.add(sampler)
    assert same == SAME_AS_DEFAULT[fam.sampling], f"the default picture of {fam.title} from {sorted(same)}"


#: Each flow family's own schedule as an sd-cli scheduler name: the picture equals the default's.
OWN_SCHEDULE = {"flux": "flux", "chroma": "flux", "flux2_klein": "flux2", "flux2": "flux2"}


@pytest.mark.parametrize("name", ROWS)
def test_every_scheduler_runs_or_is_refused(name: str, runs, monkeypatch) -> None:
    fam = fam_of(name)
    ctx = _sampling_context(fam)
    base = runs.run(name, ctx)
    runnable = schedulers_for(fam.sampling)
    own = OWN_SCHEDULE.get(name, "discrete")
    for scheduler in SCHEDULES:
        if scheduler not in runnable:
            text = _refused(runs, name, {**ctx, "scheduler": scheduler}, monkeypatch)
            assert f"--scheduler {scheduler}: {fam.title} does not run it" in text
            monkeypatch.undo()
            continue
        got = runs.run(name, {**ctx, "scheduler": scheduler})
        assert got["params"]["scheduler"] == scheduler
        same = not _differs(got["images"], base["images"])
        assert same == (scheduler == own), f"--scheduler {scheduler} on {fam.title}: same picture {same}"
