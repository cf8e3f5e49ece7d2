"""Every family the engine runs, at its native size and step count, with random weights in the
released layouts: sdplan against diffusers (PyTorch's best dtype on this CPU) and against sd-cli
(``SDCLI=path``), in one script.

Families come from the registry (:data:`sdplan.core.families.registry.FAMILIES` that ``runs``),
each with its sd-cli defaults (size, steps, CFG scale, sampler: ``generation_defaults``) and its
files (``real_size_files.RECIPES``: the real tensor names and shapes of
``../shared/models/real_size_key_layouts.json``, the released dtypes, random values). A file
whose bf16/f16 size does not fit the RAM left (``MemAvailable`` less the other files of its set
and 2 GiB) is converted to Q8_0 by sd-cli (``-M convert``) and both engines run that GGUF.

Per family and engine, one whole generation (one picture, seed 42) in a fresh process:

- sdplan: ``sdplan generate ... --in-process`` in a worker whose ``ModuleRunner`` calls are timed
  (text = the text encoders' runs, step = the diffusion model's runs / steps, CFG included,
  decode = the VAE's runs, load = the weights' mapping and reads), whole = the command's wall
  time, peak RSS = the worker's ``VmHWM``; the estimate is what ``generate`` plans (weights and
  dry-run compute, CPU total) from a process of its own;
- predicted: what ``sdplan plan`` says of the same flags before anything loads (its time
  prediction: text, step, decode, load, whole picture), in a process of its own; the table's
  ratio on that row is the measured figure over the predicted one;
- sd-cli: the same flags; its own log lines give text (``get_learned_condition``), sampling /
  steps, decode (``decode_first_stage``) and load (``loading tensors``), its wall time and peak
  RSS (``wait4``) the rest.

Both engines load a module's weights before or inside its first run (sdplan's runner when its
session starts, which a pipeline may enter before the runs; sd-cli's graph runner before its
first compute: ``loading tensors`` comes inside ``get_learned_condition``, ``sampling`` and
``decode_first_stage``). So that the columns compare like with like, text, step and decode are
compute alone for both: each load is counted in load only, and taken out of the phase only
where it fell inside it (sdplan: a runner's loads inside its own runs; sd-cli: each ``loading
tensors`` line out of the phase that completes next). With two steps or more sdplan's step is
the median step after the first (diffusers' is timed after a warm-up call) and its first step
is printed beside it.

A load reads the files from the page cache or from the drive, and whichever engine runs first
leaves the files cached for the next one (15.8 GB of klein's files in a RAM of 23 GiB), so by
default (``--page-cache cold``) every model file is dropped from the page cache
(``POSIX_FADV_DONTNEED``, which drops the clean pages no process maps) before each engine's
run, and the bytes still cached are printed; ``--page-cache as-is`` leaves it alone, and
``--page-cache all`` (root) drops the whole page cache: other files' cached pages, reclaimed by
the kernel on the same cores while the first calls run, slowed a cold first call of klein's
encoder from 9.4 to 18.6 s of compute here.
``--rounds N`` runs each engine N times, alternating which goes first, and reports medians.
- diffusers (``--ref-python``, torch 2.13 CPU; sd1, sdxl, sd3 and flux2_klein here): the modules built from
  their published configurations with random weights in the dtype ``--ref-dtype`` (default bf16
  where the CPU has AVX512_BF16 or AMX, else fp32), one text encode, one step (CFG: batch 2),
  one decode, each after a warm-up call; whole = text + steps x step + decode (computed).

``--quant q8_0,q4_k,q5_k`` instead runs the quantised products: the family's diffusion model
converted by sd-cli to each type, the same GGUF file through both engines (step time, whole
picture, peak RSS). ``--params-backend 'diffusion=disk,te=disk,vae=disk'`` (any placement string)
goes to both engines as it is; sdplan's row then also says how many bytes of the model files
the page cache still holds after the run (``cached_after``, ``mincore``), and
``--no-page-cache-advice`` runs sdplan without the disk residency's ``POSIX_FADV_DONTNEED``.

Usage::

    python bench/bench_real_size.py [--families sd1,sdxl] [--parts sdplan,sdcli,diffusers]
        [--threads 2] [--steps N] [--size PX] [--keep DIR] [--quant q8_0,q4_k]
        [--params-backend ASSIGN] [--rounds N] [--page-cache cold|all|as-is] [--json OUT]

``--steps``/``--size`` override the native figures (the table says so). Figures not measured
are printed as ``-``. Prints the load average before and after; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import dit_cut  # noqa: E402
import real_size_files as rsf  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
REF_PYTHON = next((str(p) for p in (REPO / ".venv-ref/bin/python", Path("/work/venv-ref/bin/python")) if p.exists()),
                  "python3")
PROMPT = "a lighthouse on a cliff at sunset, oil painting"

# --------------------------------------------------------------------------- sdplan worker


def time_runners(cls: Any) -> tuple[dict[str, float], dict[str, int], dict[str, list[float]]]:
    """Wrap ``cls.run`` and ``cls._load`` (a ModuleRunner class) to time them: returns the dicts
    they fill: seconds, calls and each call's seconds (its loads inside it taken out) per runner
    name. ``acc`` gets each runner's run seconds under
    its name, every load under ``@load``, and the loads that came inside that runner's own run
    (run-scoped weights) also under ``@load:NAME`` (:func:`sdplan_parts` takes those out of the
    run). A load outside any run (a pipeline entering a runner's session before its runs, as
    SD3's conditioner does) is counted in ``@load`` alone: it is not part of a run's time."""
    acc: dict[str, float] = {}
    calls: dict[str, int] = {}
    each: dict[str, list[float]] = {}
    run0, load0 = cls.run, cls._load
    running: dict[int, float] = {}  # the runners inside a run now: seconds of loads in it

    def run(self: Any, inputs: Any) -> Any:
        t0 = time.perf_counter()
        running[id(self)] = 0.0
        try:
            return run0(self, inputs)
        finally:
            inner = running.pop(id(self), 0.0)
            dt = time.perf_counter() - t0
            acc[self.name] = acc.get(self.name, 0.0) + dt
            calls[self.name] = calls.get(self.name, 0) + 1
            each.setdefault(self.name, []).append(dt - inner)

    def load(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return load0(self, *a, **k)
        finally:
            dt = time.perf_counter() - t0
            acc["@load"] = acc.get("@load", 0.0) + dt
            if id(self) in running:  # inside the module's own run: taken out of that run's time
                acc["@load:" + self.name] = acc.get("@load:" + self.name, 0.0) + dt
                running[id(self)] += dt

    cls.run, cls._load = run, load
    return acc, calls, each


def sdplan_worker(argv: list[str]) -> dict[str, Any]:
    """Run ``sdplan generate argv --in-process`` here, timing every ModuleRunner call."""
    from sdplan.core.runtime import runner as R

    acc, calls, each = time_runners(R.ModuleRunner)
    if os.environ.get("BENCH_NO_PAGE_CACHE_ADVICE"):  # --no-page-cache-advice: as before the advice
        from sdplan.core.runtime.weights import WeightFile

        WeightFile.drop_cache = lambda self, names: 0  # type: ignore[method-assign]
    from sdplan.core.pipelines import jobs

    chosen: dict[str, Any] = {}
    start0 = jobs.start_run

    def start_run(*a: Any, **k: Any) -> Any:  # the threads generate chose (it lowers -t on a busy host)
        got = start0(*a, **k)
        chosen.update(threads=got.threads, reason=got.reason)
        return got

    jobs.start_run = start_run  # type: ignore[assignment]
    from sdplan.core.cli import main

    t0 = time.perf_counter()
    rc = main(["generate", *argv, "--in-process"])
    whole = time.perf_counter() - t0
    if rc:
        raise SystemExit(f"sdplan generate exited {rc}")
    # a module's run includes its run-scoped weight loads (disk residency): counted once, in load
    return {"whole": whole, "runs": acc, "calls": calls, "each": each, "peak_rss": _vm_hwm(), "threads": chosen,
            "cached_after": page_cache_bytes([argv[i + 1] for i, w in enumerate(argv[:-1]) if w in FILE_FLAGS])}


FILE_FLAGS = ("--model", "--diffusion-model", "--clip_l", "--clip_g", "--t5xxl", "--llm", "--vae")


def page_cache_bytes(paths: list[str]) -> int:
    """Bytes of these files in the page cache now (``mincore``; 0 where it cannot be read)."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from test_disk_page_cache import cached_fraction
    except ImportError:
        return 0
    total = 0
    for p in paths:
        size = Path(p).stat().st_size
        total += int(cached_fraction(Path(p), [(0, size)]) * size)
    return total


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def estimate_worker(files: dict[str, list[str]], px: int, placement: dict[str, str]) -> dict[str, Any]:
    """What ``generate`` plans for the run on the CPU (bytes): weights, compute, total."""
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.placement import Placement
    from sdplan.core.planning.plan import resolve
    from sdplan.core.runtime.devices import live_inventory

    inv = live_inventory()
    prof = profile_from_model_flags(files)
    plan = resolve(Placement.from_strings(placement.get("backend", "CPU"), placement.get("params_backend", ""), ""),
                   inv, prof)
    fit = estimate_plan(plan, prof, inv, width=px, height=px, engine="sdplan",
                        measured=measure_compute(files, width=px, height=px))
    d = fit.devices["CPU"]
    return {"estimate": d.total, "weights": d.weights, "compute": d.compute}


#: the table's rows per family: the runs, and what ``sdplan plan`` predicted before them
ENGINES = ("sdplan", "predicted", "sdcli", "diffusers")


def predicted(argv: list[str], threads: int) -> dict[str, float]:
    """What ``sdplan plan`` predicts, before loading anything, for the generate flags ``argv``
    (the same files, size, steps, CFG scale, sampler, placement and threads): text, step,
    decode, load and whole picture in seconds (its ``time`` object: :mod:`sdplan.core.planning.timing`)."""
    keep = {"-W", "-H", "--steps", "--cfg-scale", "--sampling-method", "--params-backend", *FILE_FLAGS}
    plan_argv = [x for i in range(0, len(argv) - 1) if argv[i] in keep for x in argv[i:i + 2]]
    res = subprocess.run([sys.executable, "-c", "import sys; from sdplan.core.cli import main; "
                          "sys.exit(main(sys.argv[1:]))", "plan", *plan_argv, "-t", str(threads), "--json"],
                         capture_output=True, text=True)
    t = json.loads(res.stdout or "{}").get("time") if res.returncode == 0 else None
    if not t:
        raise RuntimeError(f"sdplan plan gave no time prediction:\n{(res.stderr or res.stdout)[-2000:]}")
    return {"text": t["text_s"], "step": t["step_s"], "decode": t["decode_s"], "load": t["load_s"],
            "whole": t["image_s"]}


def sdplan_parts(res: dict[str, Any], steps: int) -> dict[str, float]:
    """text / step / decode / load / whole (seconds) and peak RSS (bytes) of a worker's result.

    With two steps or more, ``step`` is the median step after the first (the diffusion
    model's calls grouped per step), as diffusers' step is timed after a warm-up call, and
    ``first_step`` the first step's time (its graph built, its compute buffers first
    touched); with one step ``step`` is that first step."""
    runs = dict(res["runs"])
    load = runs.pop("@load", 0.0)
    for k in [k for k in runs if k.startswith("@load:")]:  # each runner's loads came inside its runs
        inner = runs.pop(k)
        if k[6:] in runs:
            runs[k[6:]] -= inner
    diff = runs.pop("diffusion", 0.0)
    dec = sum(v for k, v in runs.items() if k in ("vae", "taesd"))
    text = sum(v for k, v in runs.items() if k not in ("vae", "taesd", "upscaler", "control"))
    out = {"text": text, "step": diff / max(steps, 1), "decode": dec, "load": load, "whole": res["whole"],
           "peak_rss": res["peak_rss"]}
    per = list(res.get("each", {}).get("diffusion", ()))
    if steps >= 2 and per and len(per) % steps == 0:
        k = len(per) // steps  # calls per step (CFG run as two calls, parallel CFG's copy...)
        by_step = [sum(per[i:i + k]) for i in range(0, len(per), k)]
        out["first_step"], out["step"] = by_step[0], statistics.median(by_step[1:])
    if "cached_after" in res:  # the model files' bytes left in the page cache after the run
        out["cached_after"] = res["cached_after"]
    return out


# --------------------------------------------------------------------------- sd-cli

SDCLI_LINES = {"text": r"get_learned_condition completed, taking ([\d.]+)s",
               "sampling": r"sampling completed, taking ([\d.]+)s",
               "decode": r"decode_first_stage completed, taking ([\d.]+)s",
               "load": r"loading tensors completed, taking ([\d.]+)s"}


def sdcli_phases(text: str) -> dict[str, float]:
    """Seconds per phase from sd-cli's log: each phase's lines summed. It loads each module's
    tensors when the module first runs (one ``loading tensors`` line each, inside the phase
    that completes next): that load is taken out of the phase (``text``, ``sampling``,
    ``decode``: compute alone) and counted in ``load``."""
    out: dict[str, float] = {}
    for k, rx in SDCLI_LINES.items():
        found = re.findall(rx, text)
        if found:
            out[k] = sum(float(v) for v in found)
    phases = "|".join(SDCLI_LINES[k] for k in ("text", "sampling", "decode"))
    pending = 0.0
    for m in re.finditer(f"{SDCLI_LINES['load']}|{phases}", text):
        got = [g for g in m.groups() if g is not None]
        if m.group(0).startswith("loading tensors"):
            pending += float(got[0])
            continue
        phase = next(k for k in ("text", "sampling", "decode") if re.match(SDCLI_LINES[k], m.group(0)))
        out[phase] -= pending
        pending = 0.0
    return out


def run_sdcli(sdcli: str, argv: list[str], steps: int, log: Path) -> dict[str, float]:
    """One sd-cli generation: its logged phases, wall time and peak RSS (``wait4``)."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        p = subprocess.Popen([sdcli, *argv, "-v"], stdout=fh, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    whole = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:  # the phases it finished stay in the table (an out-of-memory kill in its decode)
        why = "killed (SIGKILL: out of memory?)" if rc == -9 else f"exited {rc}"
        print(f"  sd-cli {why}; the phases its log completed are kept, the rest is not measured ({log})",
              file=sys.stderr, flush=True)
    got = sdcli_phases(text)
    return {"text": got.get("text", float("nan")), "step": got.get("sampling", float("nan")) / max(steps, 1),
            "decode": got.get("decode", float("nan")), "load": got.get("load", float("nan")),
            "whole": whole if rc == 0 else float("nan"), "peak_rss": ru.ru_maxrss * 1024}


def sdcli_convert(sdcli: str, src: Path, dst: Path, qtype: str) -> Path:
    """``src`` converted to GGUF ``qtype`` by sd-cli (once; kept beside)."""
    if not dst.exists():
        subprocess.run([sdcli, "-M", "convert", "-m", str(src), "-o", str(dst), "--type", qtype.replace("_k", "_K")],
                       check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dst


# --------------------------------------------------------------------------- diffusers

REF_CODE = r'''
import json, sys, time, resource, torch
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"]); torch.set_grad_enabled(False); torch.manual_seed(0)
dt = torch.bfloat16 if a["dtype"] == "bf16" else torch.float32
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel
fam, px = a["family"], a["px"]
VAE = dict(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",)*4,
           up_block_types=("UpDecoderBlock2D",)*4, layers_per_block=2, latent_channels=4)
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
              hidden_act="quick_gelu")
t0 = time.perf_counter()
if fam == "sd1":
    unet = UNet2DConditionModel(cross_attention_dim=768, attention_head_dim=8)
    encs = [CLIPTextModel(CLIPTextConfig(**CLIP_L))]
    ctx_dim, extra = 768, {}
elif fam == "sdxl":
    unet = UNet2DConditionModel(sample_size=128, layers_per_block=2, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816)
    encs = [CLIPTextModel(CLIPTextConfig(**CLIP_L)),
            CLIPTextModel(CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_attention_heads=20,
                                         num_hidden_layers=32, hidden_act="gelu"))]
    ctx_dim = 2048
    extra = {"added_cond_kwargs": {"text_embeds": torch.randn(2, 1280, dtype=dt),
                                   "time_ids": torch.tensor([[px, px, 0, 0, px, px]] * 2, dtype=dt)}}
elif fam == "sd3":
    # built in the reference dtype from the start: T5-XXL's 4.8 B parameters in fp32 would not
    # fit beside the rest
    import diffusers
    from transformers import CLIPTextModelWithProjection, T5Config, T5EncoderModel
    torch.set_default_dtype(dt)
    unet = getattr(diffusers, a["dit"][0])(**a["dit"][1])
    encs = [CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_L, projection_dim=768)),
            CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, intermediate_size=5120,
                num_attention_heads=20, num_hidden_layers=32, hidden_act="gelu", projection_dim=1280)),
            T5EncoderModel(T5Config(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24,
                                    feed_forward_proj="gated-gelu", vocab_size=32128))]
    torch.set_default_dtype(torch.float32)
    VAE.update(latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)
elif fam == "flux2_klein":  # FLUX.2 klein 4B: Qwen3-4B over 512 tokens, the DiT at CFG 1, FLUX.2's VAE
    import diffusers
    from diffusers import AutoencoderKLFlux2
    from transformers import Qwen3Config, Qwen3Model
    torch.set_default_dtype(dt)
    unet = getattr(diffusers, a["dit"][0])(**a["dit"][1])
    encs = [Qwen3Model(Qwen3Config(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936))]
    torch.set_default_dtype(torch.float32)
else:
    raise SystemExit(f"no diffusers reference for {fam}")
vae = AutoencoderKLFlux2() if fam == "flux2_klein" else AutoencoderKL(**VAE)
for m in (unet, vae, *encs): m.eval().to(dt)
build = time.perf_counter() - t0
def once(fn):
    fn(); t0 = time.perf_counter(); fn(); return time.perf_counter() - t0
ids = torch.randint(0, 32000, (1, 512 if fam == "flux2_klein" else 77))
out = {"text": sum(once(lambda e=e: e(ids)) for e in encs)}
h = px // 8
if fam == "flux2_klein":  # one call (CFG 1): 4096 image tokens (2x2 patches folded in) and 512 text tokens
    g, T = px // 16, 512
    img_ids = torch.zeros(g, g, 4); img_ids[..., 1] = torch.arange(g)[:, None]; img_ids[..., 2] = torch.arange(g)[None, :]
    txt_ids = torch.zeros(1, T, 4); txt_ids[0, :, 3] = torch.arange(T)
    hs, ctx = torch.randn(1, g * g, 128, dtype=dt), torch.randn(1, T, 7680, dtype=dt)
    step = lambda: unet(hidden_states=hs, encoder_hidden_states=ctx, timestep=torch.tensor([0.5], dtype=dt),
                        img_ids=img_ids.reshape(1, g * g, 4), txt_ids=txt_ids)
    x = torch.randn(1, 32, h, h, dtype=dt)
elif fam == "sd3":  # CFG: batch 2; 77 CLIP and 77 T5 tokens, as sd-cli pads them
    x = torch.randn(2, 16, h, h, dtype=dt)
    step = lambda: unet(hidden_states=x, encoder_hidden_states=torch.randn(2, 154, 4096, dtype=dt),
                        pooled_projections=torch.randn(2, 2048, dtype=dt), timestep=torch.tensor([500.0, 500.0]))
else:
    x = torch.randn(2, 4, h, h, dtype=dt); ctx = torch.randn(2, 77, ctx_dim, dtype=dt)
    step = lambda: unet(x, torch.tensor([500.0, 500.0]), encoder_hidden_states=ctx, **extra)
out["step"] = once(step)
out["decode"] = once(lambda: vae.decode(x[:1]))
out["whole"] = out["text"] + a["steps"] * out["step"] + out["decode"]
out["build"] = build
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
'''

REF_FAMILIES = ("sd1", "sdxl", "sd3", "flux2_klein")


#: family -> its name in bench_dit_blocks' diffusers configurations (the DiT families here)
REF_DITS = {"sd3": "sd3", "flux2_klein": "flux2"}


def ref_dit(a: argparse.Namespace, fam: str) -> tuple[str, dict[str, Any]] | None:
    """The diffusers class and configuration of ``fam``'s whole DiT (bench_dit_blocks'
    ``REF_CONFIGS``, tested against sdplan's reading of the real layouts, with every block of
    the real layout), or None for the UNet families."""
    if fam not in REF_DITS:
        return None
    import bench_dit_blocks as bdb

    name = REF_DITS[fam]
    counts = dit_cut.stacks(dit_cut.dit_layout(name, rsf.layouts(Path(a.shared))))
    return bdb.ref_config(name, counts)


def run_diffusers(a: argparse.Namespace, fam: str, px: int, steps: int) -> dict[str, float] | None:
    if fam not in REF_FAMILIES:
        return None
    arg = json.dumps({"threads": a.threads, "dtype": a.ref_dtype, "family": fam, "px": px, "steps": steps,
                      "dit": ref_dit(a, fam)})
    res = subprocess.run([a.ref_python, "-c", REF_CODE, arg], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"diffusers {fam} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- files and runs


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def model_files(a: argparse.Namespace, fam: str, folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The family's files (written once into ``folder``), Q8_0 where bf16 does not fit RAM:
    ``({flag: path}, notes)``."""
    recipe = rsf.RECIPES[fam]
    assert not isinstance(recipe, str)
    lay = rsf.layouts(Path(a.shared))
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {mf.flag: rsf._header(rsf.shapes_of(mf, lay), mf.dtype)[1] for mf in recipe}
    out: dict[str, Path] = {}
    notes: list[str] = []
    for mf in recipe:
        path = folder / mf.name
        if not path.exists() or path.stat().st_size < sizes[mf.flag]:
            t0 = time.perf_counter()
            rsf.write_random(path, mf, lay)
            print(f"  wrote {path.name} ({sizes[mf.flag] / GIB:.2f} GiB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        # the largest module must fit beside nothing else: its own bytes and 2 GiB of compute
        if sizes[mf.flag] + 2 * GIB > mem_available():
            if not a.sdcli:
                raise SystemExit(f"{fam}: {mf.name} ({sizes[mf.flag] / GIB:.1f} GiB) does not fit in RAM and "
                                 "no SDCLI to convert it to Q8_0")
            path = sdcli_convert(a.sdcli, path, path.with_suffix(".q8_0.gguf"), "q8_0")
            notes.append(f"{mf.name} as Q8_0 (bf16 does not fit in RAM)")
        out[mf.flag] = path
    return out, notes


def gen_args(files: dict[str, Path], px: int, steps: int, cfg: float, sampler: str, threads: int, out: Path,
             params_backend: str) -> list[str]:
    argv = [x for flag, p in files.items() for x in (flag, str(p))]
    argv += ["-p", PROMPT, "-W", str(px), "-H", str(px), "--steps", str(steps), "--cfg-scale", str(cfg),
             "--sampling-method", sampler, "-s", "42", "-t", str(threads), "-o", str(out)]
    if params_backend:
        argv += ["--params-backend", params_backend]
    return argv


def _child(mode: str, payload: Any) -> dict[str, Any]:
    res = subprocess.run([sys.executable, __file__, mode, json.dumps(payload)], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{mode} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def drop_page_cache(paths: list[Path]) -> int:
    """Advise ``POSIX_FADV_DONTNEED`` over each whole file (the kernel drops its clean pages that
    no process maps); returns the bytes of the files still in the page cache afterwards."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return page_cache_bytes([str(p) for p in paths])


#: Writing 3 here drops the whole page cache (clean pages no process maps) and the dentries
#: and inodes (``Documentation/admin-guide/sysctl/vm.rst``); root only.
DROP_CACHES = "/proc/sys/vm/drop_caches"


def _page_cache(a: argparse.Namespace, files: dict[str, Path], who: str) -> None:
    paths = list(files.values())
    if a.page_cache == "all":
        os.sync()
        Path(DROP_CACHES).write_text("3\n")
        print(f"  {who}: whole page cache dropped, {mem_available() / GIB:.1f} GiB available", flush=True)
    elif a.page_cache == "cold":
        left = drop_page_cache(paths)
        print(f"  {who}: page cache dropped, {left / MIB:.0f} MiB of the files still cached", flush=True)
    else:
        print(f"  {who}: {page_cache_bytes([str(p) for p in paths]) / MIB:.0f} MiB of the files cached", flush=True)


def run_family(a: argparse.Namespace, fam: str, files: dict[str, Path], px: int, steps: int, cfg: float,
               sampler: str, tmp: Path, sdcli_first: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {}
    argv = gen_args(files, px, steps, cfg, sampler, a.threads, tmp / f"{fam}-sdplan.png", a.params_backend)
    if sdcli_first and "sdcli" in a.parts and a.sdcli:
        _run_sdcli_part(a, fam, files, px, steps, cfg, sampler, tmp, row)
    if "sdplan" in a.parts:
        _page_cache(a, files, "sdplan")
        res = _child("--sdplan-worker", argv)
        row["sdplan"] = sdplan_parts(res, steps)
        row["sdplan"]["calls"] = res["calls"]
        row["sdplan"]["each"] = res.get("each", {})  # every call's seconds, per runner (the JSON)
        row["sdplan"]["threads"] = res.get("threads", {})
        est_files = {flag.lstrip("-").replace("-", "_"): [str(p)] for flag, p in files.items()}
        placement = {"params_backend": a.params_backend} if a.params_backend else {}
        try:
            row["estimate"] = _child("--estimate-worker", [est_files, px, placement])
        except RuntimeError as exc:
            row["estimate"] = {"error": str(exc).splitlines()[-1]}
        print(f"  sdplan: {_fmt(row['sdplan'])}; threads {row['sdplan']['threads']}", flush=True)
        try:
            row["predicted"] = predicted(argv, int(row["sdplan"]["threads"].get("threads") or a.threads))
            print(f"  sdplan plan predicted: {_fmt(row['predicted'])}", flush=True)
        except RuntimeError as exc:
            print(f"  sdplan plan: {str(exc).splitlines()[0]}", flush=True)
    if not sdcli_first and "sdcli" in a.parts and a.sdcli:
        _run_sdcli_part(a, fam, files, px, steps, cfg, sampler, tmp, row)
    if "diffusers" in a.parts:
        ref = run_diffusers(a, fam, px, steps)
        if ref is not None:
            row["diffusers"] = ref
            print(f"  diffusers {a.ref_dtype}: {_fmt(ref)}", flush=True)
    return row


def _run_sdcli_part(a: argparse.Namespace, fam: str, files: dict[str, Path], px: int, steps: int, cfg: float,
                    sampler: str, tmp: Path, row: dict[str, Any]) -> None:
    _page_cache(a, files, "sd-cli")
    sargv = gen_args(files, px, steps, cfg, sampler, a.threads, tmp / f"{fam}-sdcli.png", a.params_backend)
    row["sdcli"] = run_sdcli(a.sdcli, sargv, steps, tmp / f"{fam}-sdcli.log")
    print(f"  sd-cli: {_fmt(row['sdcli'])}", flush=True)


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of several rounds' rows: each engine's numeric figures as their medians (the
    rest from the first round), with ``rounds`` the count."""
    import statistics

    out = dict(rows[0])
    for eng in ENGINES:
        got = [r[eng] for r in rows if eng in r]
        if not got:
            continue
        med = dict(got[0])
        for k, v in got[0].items():
            if isinstance(v, float | int) and not isinstance(v, bool):
                med[k] = statistics.median(g[k] for g in got)
        med["rounds"] = len(got)
        out[eng] = med
    return out


def _fmt(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v / MIB:.0f} MiB" if k in ("peak_rss", "cached_after") else f"{k} {v:.3f}"
                     for k, v in d.items() if isinstance(v, float | int) and k not in ("calls",))


def print_table(rows: dict[str, dict[str, Any]], a: argparse.Namespace) -> None:
    cols = ("text", "step", "decode", "load", "whole", "peak_rss")
    print(f"\n{a.threads} thread(s); seconds (ratio sdplan / other); '-' not measured")
    print("| family | size, steps | engine | " + " | ".join(cols) + " | estimate / peak |")
    print("|---" * (len(cols) + 4) + "|")
    for fam, row in rows.items():
        ours = row.get("sdplan", {})
        est = row.get("estimate", {})
        for eng in ENGINES:
            r = row.get(eng)
            if r is None:
                continue
            cells = []
            for c in cols:
                v = r.get(c)
                if v is None or v != v:
                    cells.append("-")
                    continue
                s = f"{v / MIB:.0f} MiB" if c == "peak_rss" else f"{v:.2f}"
                if eng != "sdplan" and ours.get(c) and v:
                    s += f" ({ours[c] / v:.2f}x)"
                cells.append(s)
            tail = ""
            if eng == "sdplan" and est.get("estimate"):
                tail = f"{est['estimate'] / GIB:.2f} / {r['peak_rss'] / GIB:.2f} GiB"
            print(f"| {fam} | {row['size']}, {row['steps']} | {eng} | " + " | ".join(cells) + f" | {tail} |")


PARTS = ("sdplan", "sdcli", "diffusers")
#: the ``--quant`` types sd-cli converts the diffusion model to
QUANTS = ("q8_0", "q4_k", "q5_k")


def check_flags(a: argparse.Namespace) -> None:
    """Refuse flags that would fail or be ignored only after the files are written and the
    engines run: a family without a recipe (``real_size_files.RECIPES``), a part other than
    :data:`PARTS`, a thread, round, step or size count below 1 (``--steps 0`` and
    ``--size 0`` were taken as not given), a ``--shared`` folder without the layouts (a
    traceback once the first family started), a ``--quant`` type other than :data:`QUANTS` or
    one without sd-cli (refused after the first family's files were written), ``--page-cache
    all`` where :data:`DROP_CACHES` is not writable, and a ``--json`` whose folder does not
    exist (its rows lost when the last run ended).

    Raises:
        SystemExit: one line naming the flag and the value at fault.
    """
    unknown = [f for f in a.families.split(",") if f and f not in rsf.RECIPES]
    if unknown or not [f for f in a.families.split(",") if f]:
        raise SystemExit(f"--families {a.families!r}: no recipe for {unknown or 'an empty list'}; "
                         f"choose from {', '.join(rsf.RECIPES)}")
    bad = [p for p in a.parts.split(",") if p not in PARTS]
    if bad:
        raise SystemExit(f"--parts {a.parts!r}: unknown {bad}; choose from {', '.join(PARTS)}")
    for flag, value in (("--threads", a.threads), ("--rounds", a.rounds), ("--steps", a.steps),
                        ("--size", a.size)):
        if value is not None and value < 1:
            raise SystemExit(f"{flag} must be at least 1, got {value}")
    if not (Path(a.shared) / "models" / "real_size_key_layouts.json").is_file():
        raise SystemExit(f"--shared {a.shared!r}: no models/real_size_key_layouts.json in it")
    quants = [q for q in a.quant.split(",") if q]
    if [q for q in quants if q not in QUANTS] or (a.quant and not quants):
        raise SystemExit(f"--quant {a.quant!r}: choose from {', '.join(QUANTS)}")
    if quants and not a.sdcli:
        raise SystemExit(f"--quant {a.quant!r} needs --sdcli or SDCLI (sd-cli converts the files)")
    if getattr(a, "page_cache", "cold") == "all" and not os.access(DROP_CACHES, os.W_OK):
        raise SystemExit(f"--page-cache all: {DROP_CACHES} is not writable here (it needs root)")
    if a.json and not Path(a.json).resolve().parent.is_dir():
        raise SystemExit(f"--json {a.json!r}: no folder {str(Path(a.json).resolve().parent)!r} to write it in")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--sdplan-worker":
        print(json.dumps(sdplan_worker(json.loads(sys.argv[2]))))
        return 0
    if len(sys.argv) > 2 and sys.argv[1] == "--estimate-worker":
        print(json.dumps(estimate_worker(*json.loads(sys.argv[2]))))
        return 0
    from sdplan.core.families.registry import FAMILIES, generation_defaults, recommended_sizes
    from sdplan.core.runtime.native import native

    running = [f.name for f in FAMILIES if f.runs]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--families", default=",".join(running),
                    help="families to run, comma-separated (default: every family the engine runs)")
    ap.add_argument("--parts", default="sdplan,sdcli,diffusers",
                    help="engines to run, comma-separated (default sdplan,sdcli,diffusers)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads asked of every engine (default 2)")
    ap.add_argument("--steps", type=int, help="instead of the family's default step count")
    ap.add_argument("--size", type=int, help="instead of the family's native size (pixels, square)")
    ap.add_argument("--quant", default="", help="GGUF types of the diffusion model to run (q8_0,q4_k,q5_k)")
    ap.add_argument("--params-backend", default="", help="placement string given to both engines")
    ap.add_argument("--no-page-cache-advice", action="store_true",
                    help="sdplan without the disk residency's POSIX_FADV_DONTNEED (the page cache it leaves)")
    ap.add_argument("--sdcli", default=os.environ.get("SDCLI", ""),
                    help="the sd-cli binary (default $SDCLI; none: no sd-cli runs or Q8_0 conversions)")
    ap.add_argument("--ref-python", default=REF_PYTHON,
                    help=f"Python with torch and diffusers for the reference (default {REF_PYTHON})")
    ap.add_argument("--ref-dtype", default="bf16" if native().bf16_cpu_kernel() != "off" else "fp32",
                    help="the reference's dtype (default bf16 where this CPU has a bf16 kernel, else fp32)")
    ap.add_argument("--shared", default=str(REPO.parent / "shared"),
                    help="the folder holding models/real_size_key_layouts.json (default ../shared)")
    ap.add_argument("--keep", default="/tmp/sdplan-real-size", help="folder for the model files (kept)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--rounds", type=int, default=1, help="runs per engine, alternating the order (medians)")
    ap.add_argument("--page-cache", choices=("cold", "all", "as-is"), default="cold",
                    help="before each engine's run drop the model files from the page cache (cold), the "
                         "whole page cache (all: root, /proc/sys/vm/drop_caches; other files' cache left "
                         "for the kernel to reclaim during the first calls slows them) or nothing (as-is)")
    a = ap.parse_args()
    check_flags(a)
    a.parts = a.parts.split(",")
    if a.no_page_cache_advice:
        os.environ["BENCH_NO_PAGE_CACHE_ADVICE"] = "1"
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    print(f"host CPU: {cpu}; sdplan bf16 kernel {native().bf16_kernel()}; threads {a.threads}; "
          f"load average before: {os.getloadavg()}; RAM available {mem_available() / GIB:.1f} GiB")
    rows: dict[str, dict[str, Any]] = {}
    keep = Path(a.keep)
    for fam in a.families.split(","):
        recipe = rsf.RECIPES.get(fam)
        if recipe is None or isinstance(recipe, str):
            print(f"{fam}: not run: {recipe or 'no recipe'}")
            continue
        d = generation_defaults(fam)
        px = a.size or (recommended_sizes(fam) or ((1024, 1024),))[0][0]
        steps = a.steps or int(d.get("steps", 20))  # type: ignore[call-overload]
        cfg, sampler = float(d.get("cfg_scale", 1.0)), str(d.get("sampling_method", "euler"))  # type: ignore[arg-type]
        print(f"{fam}: {px} px, {steps} steps, CFG {cfg}, {sampler}", flush=True)
        files, notes = model_files(a, fam, keep / fam)
        variants = [("", files)]
        if a.quant:
            if not a.sdcli:
                raise SystemExit("--quant needs SDCLI (sd-cli converts the files)")
            key = "--diffusion-model" if "--diffusion-model" in files else "--model"
            recipe = rsf.RECIPES[fam]
            assert not isinstance(recipe, str)
            src = keep / fam / next(mf.name for mf in recipe if mf.flag == key)  # the released dtype's file
            variants = [(q, {**files, key: sdcli_convert(a.sdcli, src, src.with_suffix(f".{q}.gguf"), q)})
                        for q in a.quant.split(",")]
        for q, fs in variants:
            name = f"{fam} {q}".strip()
            rounds = []
            for k in range(a.rounds):  # alternating which engine goes first
                print(f"  round {k + 1} of {a.rounds}; load average {os.getloadavg()}", flush=True)
                rounds.append(run_family(a, fam, fs, px, steps, cfg, sampler, keep, sdcli_first=k % 2 == 1))
            rows[name] = {**median_row(rounds), "size": px, "steps": steps, "notes": notes, "each_round": rounds}
    print(f"\nload average after: {os.getloadavg()}")
    print_table(rows, a)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
