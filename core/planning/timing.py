"""How long a plan takes: seconds per sampling step and per picture, per module and device.

:func:`predict_time` prices each module's graphs (their work per device,
:mod:`sdplan.core.planning.work`, counted from the engine's own graphs, else a formula)
with each device's profile (:mod:`sdplan.core.planning.device_profile`) and adds the weight
traffic the plan's residency causes, as sdplan's engine moves weights
(:mod:`sdplan.core.runtime.runner`):

- **one graph call** on its devices, one after another as the graph scheduler runs them:
  per device ``sum(FLOP / rate(class, kernel, dtype, op size))`` over its ops, plus its
  memory-bound bytes at the device's rate for each such kernel (its memory bandwidth for a
  kernel not measured) and ``op_s`` per memory-bound op,
  plus ``nodes * node_s + graph_s``;
  the inputs copied to the main device and the outputs back (host links); the activations
  copied at split boundaries (the residual stream of a layer split, the conditioning each
  range reads): device to host to device, or one hop where one side is the CPU.
- **weights, by residency** (the runner's ``prepare`` and ``session``): ``runtime``
  weights are read once at load (a CPU maps them: each page is first touched once; another
  device reads the file, page cache warm, and uploads every tensor); ``device`` residency
  reads them once into the params device and copies them to the runtime devices once per
  *use* (a text encoding, a whole sampling loop, a decode); ``disk`` reads (or maps) them
  once per use. A module cut into ``--max-vram`` segments moves its segments per call. Each
  use also allocates its graphs' compute buffers (the engine frees them after a use).
- **a picture**: load, the text encoder's calls (one per prompt; CFG adds the negative
  one), ``steps`` sampler steps (a second-order sampler evaluates twice per step; SD's CFG
  runs as one batch of 2N, SD3's as two passes; with parallel CFG, ``--backend cfg=DEVICE``,
  the two halves run at the same time on their devices and the slower counts: graphs of one
  :attr:`~sdplan.core.planning.work.ModuleWork.group`), and the decode, each use with its
  weight traffic.

A CPU profile measured with another thread count than the run uses is scaled in
proportion (compute and memory bandwidth; stated in the notes). Devices without a profile
take :func:`~sdplan.core.planning.device_profile.default_profile` and the notes say so.

Formula where no count exists (families without the engine's dry run, a profile without
files): a module of ``P`` parameters (bytes / bytes per weight of the file type in the
profile's name, else 2 for f16) does ``2 * P * T`` FLOP per call, ``T`` its tokens: DiTs
``latent pixels / 4 + text tokens`` (the text tokens of the family's registry entry,
:attr:`~sdplan.core.families.declaration.ComputeShape.tokens`), UNets ``latent pixels *``
:data:`UNET_TOKENS_PER_LATENT_PX`, text encoders their context (77 per CLIP chunk, 512
for T5 and LLM encoders, 77 per chunk for SD3's); VAE decoders
:data:`VAE_FLOP_PER_PX` per image pixel scaled by their size against SD's VAE. These two
constants come from the engine's own count of SD 1.5's UNet and VAE (the work job on a
real-size SD 1.5 layout at 512 px). A video (``frames`` > 1, Wan) multiplies a DiT's patch
tokens by its latent frames (``(frames - 1) // 4 + 1``, the Wan VAE's 4x time compression)
and adds the attention over all of them, ``4 * T^2 * width`` FLOP per block (``QK^T`` and
the product with ``V``; width from the registry entry's ``ComputeShape``), which dominates
at real video sizes; the decoder's work is per image pixel of every frame.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sdplan.core.families import family_of, variant_of
from sdplan.core.planning.device_profile import (
    DeviceProfile,
    DriveProfile,
    Link,
    default_profile,
    drive_for,
)
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.work import DeviceWork, GraphWork, ModuleWork, OpGroup

#: Samplers that evaluate the model twice per step (k-diffusion's second-order methods).
TWO_EVALUATIONS = frozenset({"heun", "dpm2", "dpm++2s_a", "res_2s"})

#: Modules priced, in the order a picture runs them (other planned modules are named in the
#: notes as not priced).
PRICED = ("te", "diffusion", "controlnet", "vae")
#: Text tokens of an encoder per call, by its name in a profile's ``te`` breakdown.
ENCODER_TOKENS = {"clip_l": 77, "clip_g": 77, "clip_h": 77, "t5xxl": 512, "llm": 512}

#: UNet FLOP per call = 2 * params * latent pixels * this: SD 1.5's UNet, counted by the
#: engine at 512 px (64x64 latent, one image): 0.803 TFLOP for its 860 M parameters.
UNET_TOKENS_PER_LATENT_PX = 0.1141
#: VAE decoder FLOP per image pixel: SD's VAE (167 MB in f16), counted by the engine at
#: 512 px: 2.51 TFLOP; other VAEs scale by their size against it (:data:`SD_VAE_BYTES`).
VAE_FLOP_PER_PX = 9.59e6
SD_VAE_BYTES = 167_307_726

#: Bytes per weight of file types named in profile names (``flux1-dev-q8_0``).
_BYTES_PER_WEIGHT = (("q8_0", 1.0625), ("q6_k", 0.8203), ("q5_k", 0.6875), ("q5_0", 0.6875),
                     ("q4_k", 0.5625), ("q4_0", 0.5625), ("q3_k", 0.4297), ("q2_k", 0.3281),
                     ("f32", 4.0), ("bf16", 2.0), ("f16", 2.0))


@dataclass(frozen=True)
class RunSettings:
    """What the picture is: size, batch, steps, sampler, guidance, CPU threads (0: as the
    CPU profile was measured)."""

    width: int = 512
    height: int = 512
    batch: int = 1
    steps: int = 20
    sampler: str = "euler_a"
    cfg: bool = True
    threads: int = 0
    frames: int = 1

    @property
    def latent_frames(self) -> int:
        """A video's latent frames (4x time compression, the first frame alone); 1 for a picture."""
        return (max(self.frames, 1) - 1) // 4 + 1

    @property
    def evaluations(self) -> int:
        """Model evaluations per sampler step."""
        return 2 if self.sampler in TWO_EVALUATIONS else 1


@dataclass(frozen=True)
class ModuleTime:
    """One module's seconds: ``call_s`` per graph call by device (its share; ``io`` and
    ``copies`` for the transfers of a call), ``calls`` per use, ``uses`` per picture
    (its phase), ``stage_s`` of weight traffic and buffer allocation per use, ``load_s``
    once, ``source`` of its work (``counted`` or ``formula``)."""

    module: str
    phase: str
    call_s: Mapping[str, float]
    calls: int
    stage_s: float
    load_s: float
    source: str

    @property
    def call_total(self) -> float:
        return sum(self.call_s.values())

    @property
    def use_s(self) -> float:
        """Seconds of one use: its calls and its weight traffic."""
        return self.calls * self.call_total + self.stage_s

    def to_json(self) -> dict[str, object]:
        return {"phase": self.phase, "call_s": dict(self.call_s), "calls": self.calls,
                "stage_s": self.stage_s, "load_s": self.load_s, "source": self.source}


@dataclass(frozen=True)
class TimeReport:
    """Predicted seconds of a plan: per step, per picture (with and without the load), per
    phase, per module (:class:`ModuleTime`, several for a module of several graphs) and
    per device, and the notes on what was assumed."""

    step_s: float
    text_s: float
    sampling_s: float
    decode_s: float
    load_s: float
    modules: Mapping[str, tuple[ModuleTime, ...]]
    devices: Mapping[str, float]
    settings: RunSettings
    notes: tuple[str, ...] = ()
    profiles: Mapping[str, str] = field(default_factory=dict)

    @property
    def image_s(self) -> float:
        """Seconds per picture from a fresh engine: load, text, sampling and decode."""
        return self.load_s + self.text_s + self.sampling_s + self.decode_s

    @property
    def measured(self) -> bool:
        """Whether every device priced has a measured profile (False: some run on stated
        default speeds)."""
        return all(v != "default" for v in self.profiles.values())

    def summary(self) -> str:
        """One line for people: ``~0.8 s/step, ~19 s/picture (load 3.0 s)``, with
        ``· default speeds`` when a device priced has no measured profile."""
        line = (f"~{seconds_text(self.step_s)} s/step, ~{seconds_text(self.image_s)} s/picture "
                f"(load {seconds_text(self.load_s)} s)")
        return line if self.measured else f"{line} · default speeds"

    def to_json(self) -> dict[str, object]:
        """``sdplan plan --json``'s ``"time"`` object (seconds)."""
        return {"step_s": self.step_s, "image_s": self.image_s, "load_s": self.load_s,
                "text_s": self.text_s, "sampling_s": self.sampling_s, "decode_s": self.decode_s,
                "steps": self.settings.steps, "sampler": self.settings.sampler,
                "batch": self.settings.batch, "cfg": self.settings.cfg,
                "modules": {m: [t.to_json() for t in ts] for m, ts in self.modules.items()},
                "devices": dict(self.devices), "profiles": dict(self.profiles),
                "notes": list(self.notes)}


def seconds_text(s: float) -> str:
    """Seconds as people read them: two significant digits below 0.1 (``0.0043``), two
    decimals below 1 (``0.84``), one below 10 (``3.2``), whole seconds above (``19``)."""
    if s < 0.1:
        return f"{s:.2g}" if s > 0 else "0"
    return f"{s:.2f}" if s < 1 else f"{s:.1f}" if s < 10 else f"{s:.0f}"


class _Profiles:
    """Each device's profile for this run: measured, scaled to the run's CPU threads, or a
    stated default."""

    def __init__(self, inventory: Inventory, threads: int) -> None:
        self.inventory = {d.name: d for d in inventory}
        self.threads = threads
        self.notes: list[str] = []
        self.sources: dict[str, str] = {}
        self._cache: dict[str, DeviceProfile] = {}

    def device(self, name: str) -> Device | None:
        return self.inventory.get(name)

    def is_cpu(self, name: str) -> bool:
        d = self.inventory.get(name)
        return d is None or d.type == "cpu"

    def __call__(self, name: str) -> DeviceProfile:
        if name in self._cache:
            return self._cache[name]
        d = self.inventory.get(name)
        p = d.profile if d is not None else None
        if p is None:
            p = default_profile(d.type if d else "cpu", d.registry if d else "")
            self.sources[name] = "default"
            self.notes.append(f"{name}: no measured profile (sdplan devices --calibrate); stated "
                              "defaults for its type")
        else:
            self.sources[name] = "measured"
            if d is not None and d.type == "cpu" and p.threads and self.threads and self.threads != p.threads:
                p = _scaled(p, self.threads / p.threads)
                self.notes.append(f"{name}: profile measured with {p.threads} threads scaled to "
                                  f"{self.threads}")
        self._cache[name] = p
        return p


def _scaled(p: DeviceProfile, f: float) -> DeviceProfile:
    rates = {k: tuple((w, r * f) for w, r in v) for k, v in p.rates.items()}
    return DeviceProfile(rates, p.mem_bps * f, p.node_s, p.graph_s, p.h2d, p.d2h, p.threads, p.source, p.measured,
                         p.op_s, {k: tuple((b, r * f) for b, r in v) for k, v in p.mem_rates.items()},
                         p.alloc_s, p.alloc_byte_s, p.alloc_query_s)


def _copy_s(prof: _Profiles, src: str, dst: str, nbytes: float, transfers: int = 1) -> float:
    """Seconds to move ``nbytes`` from ``src`` to ``dst`` in ``transfers`` pieces: a CPU side
    is host memory; two other devices go through the host."""
    if src == dst:
        return 0.0
    s = 0.0
    if not prof.is_cpu(src):
        s += prof(src).d2h.seconds(nbytes, transfers)
    if not prof.is_cpu(dst):
        s += prof(dst).h2d.seconds(nbytes, transfers)
    if prof.is_cpu(src) and prof.is_cpu(dst):
        s += nbytes / prof(dst).mem_bps
    return s


def op_seconds(p: DeviceProfile, op: OpGroup) -> float:
    """Seconds of ``op.count`` ops of ``op.flops`` FLOP each on a device of profile ``p``."""
    return op.count * op.flops / p.rate(op.cls, op.kernel, op.dtype, op.flops)


def device_seconds(p: DeviceProfile, dw: DeviceWork) -> float:
    """Seconds of one device's share of a graph call (module docstring)."""
    mem = (sum(b / p.mem_rate(k, b / max(n, 1)) for k, (b, n) in dw.mem_kernels.items()) if dw.mem_kernels
           else dw.mem_bytes / p.mem_bps)
    return sum(op_seconds(p, o) for o in dw.ops) + mem + dw.mem_ops * p.op_s + dw.nodes * p.node_s + p.graph_s


def alloc_seconds(gw: GraphWork, prof: _Profiles) -> float:
    """Seconds of allocating a graph's compute buffers on each of its devices and first
    touching them (once per use)."""
    return sum(prof(d).alloc_s + dw.buffer_bytes * prof(d).alloc_byte_s + dw.alloc_queries * prof(d).alloc_query_s
               for d, dw in gw.devices.items())


#: Bytes ggml's RPC client sends per tensor of a graph at every compute (its ``rpc_tensor``
#: record with 160-byte names, as sdplan's ggml is built, and the tensor's id in the list).
RPC_TENSOR_BYTES = 396


def graph_seconds(gw: GraphWork, prof: _Profiles) -> dict[str, float]:
    """Seconds of one call of a graph: each device's share, ``io`` (inputs to the main
    device and outputs back; for an RPC device also its weights' records, which go with the
    graph at every compute: the nodes' own are in its per-node cost, and a round trip with
    the graph's fixed cost for each checkpoint among its nodes, where the compute is cut
    into one more graph call) and ``copies`` (activations between devices)."""
    out = {d: device_seconds(prof(d), dw) for d, dw in gw.devices.items()}
    for d, dw in gw.devices.items():
        dev = prof.device(d)
        if dev is not None and dev.registry.upper() == "RPC":
            p = prof(d)
            out[d] += (dw.weights + gw.inputs) * RPC_TENSOR_BYTES / p.h2d.bps
            out[d] += gw.checkpoints.get(d, 0) * (p.graph_s + p.d2h.latency_s)
    main = gw.main
    io = _copy_s(prof, "CPU", main, gw.input_bytes, max(gw.inputs, 1)) if not prof.is_cpu(main) else 0.0
    io += _copy_s(prof, main, "CPU", gw.output_bytes, max(gw.outputs, 1)) if not prof.is_cpu(main) else 0.0
    out["io"] = io
    copies = 0.0
    for key, nbytes in gw.copies.items():
        src, _, dst = key.partition(">")
        copies += _copy_s(prof, src, dst, nbytes)
    out["copies"] = copies
    return out


def _weights(mw: Sequence[ModuleWork], plan_devices: Sequence[str], total: int) -> dict[str, tuple[int, int]]:
    """Runtime device -> (weight tensors, bytes) of a module: from its counted graphs
    (largest per device), else ``total`` bytes on the main device in 500 tensors."""
    out: dict[str, tuple[int, int]] = {}
    for w in mw:
        for d, dw in w.graph.devices.items():
            if dw.weight_bytes and dw.weight_bytes > out.get(d, (0, 0))[1]:
                out[d] = (dw.weights, dw.weight_bytes)
    if not out and total:
        out[plan_devices[0]] = (500, total)
    return out


def _read_s(prof: _Profiles, drive: DriveProfile, device: str, tensors: int, nbytes: int) -> float:
    """Seconds to bring ``nbytes`` of a model file onto ``device``: mapped on a CPU (first
    touch of cached pages), else read (page cache) and uploaded tensor by tensor."""
    if prof.is_cpu(device):
        return nbytes / drive.map_bps
    return nbytes / drive.cached_bps + prof(device).h2d.seconds(nbytes, tensors)


def _stage_s(prof: _Profiles, src: str, dst: str, tensors: int, nbytes: int) -> float:
    """Seconds to copy a module's weights from its params device to a runtime device,
    tensor by tensor."""
    return _copy_s(prof, src, dst, nbytes, tensors)


def _bytes_per_weight(profile: Profile) -> float:
    name = (profile.name or "").lower()
    for key, b in _BYTES_PER_WEIGHT:
        if key in name:
            return b
    return 2.0


def formula_work(module: str, profile: Profile, s: RunSettings, device: str) -> list[ModuleWork]:
    """Module work by the formula of the module docstring (one product op per call, class
    ``mm``, f16), or [] for a module it does not cover."""
    mp = profile.get(module)
    if mp is None or not mp.total:
        return []
    params = mp.total / _bytes_per_weight(profile)
    fam = family_of(profile.architecture)
    shape = fam.compute_for(variant_of(profile.architecture)) if fam is not None else None
    dit_tokens = shape.tokens if shape is not None and shape.kind == "dit" else None
    te_tokens = shape.te_tokens if shape is not None else None
    latent = (s.width // 8) * (s.height // 8)
    prompts = 2 if s.cfg else 1

    def mw(phase: str, flops: float, calls: int) -> ModuleWork:
        op = OpGroup("mm", "formula", "f16", flops, 1)
        return ModuleWork(module, phase, GraphWork(device, {device: DeviceWork((op,))}), calls, "formula")

    if module == "diffusion":
        if dit_tokens is not None:  # DiT: CFG as separate passes
            patches = latent / 4 * s.latent_frames
            flops = 2 * params * (patches + dit_tokens)
            if s.frames > 1 and shape is not None:  # a video: attention over every frame's patches
                flops += 4 * (patches + dit_tokens) ** 2 * shape.width * max(len(mp.blocks), 1)
            return [mw("step", flops * s.batch, prompts)]
        return [mw("step", 2 * params * latent * UNET_TOKENS_PER_LATENT_PX * s.batch * prompts, 1)]
    if module == "te":
        encs = mp.encoders or {mp.block_encoder or "clip_l": mp.total}
        return [mw("text", 2 * (b / _bytes_per_weight(profile)) * (te_tokens or ENCODER_TOKENS.get(e, 77)),
                   prompts) for e, b in encs.items()]
    if module == "vae":
        return [mw("decode", VAE_FLOP_PER_PX * s.width * s.height * max(s.frames, 1) * s.batch * mp.total
                   / SD_VAE_BYTES, 1)]
    return []


def parallel_cfg_formula(mw: Sequence[ModuleWork], main: str, copy: str) -> list[ModuleWork]:
    """The formula's diffusion work under parallel CFG (``--backend cfg=DEVICE``, spec section
    14.5): each step's work in two halves, the conditional on ``main`` and the unconditional on
    ``copy``, one group (they run at the same time: the slower counts)."""
    out = []
    for w in mw:
        half = sum(o.flops * o.count for dw in w.graph.devices.values() for o in dw.ops) * w.calls / 2
        for dev in (main, copy):
            op = OpGroup("mm", "formula", "f16", half, 1)
            out.append(ModuleWork(w.module, w.phase, GraphWork(dev, {dev: DeviceWork((op,))}), 1, w.source, "cfg"))
    return out


def predict_time(plan: object, inventory: Inventory, profile: Profile | None, settings: RunSettings,
                 works: Mapping[str, Sequence[ModuleWork]] | None = None,
                 model_paths: Mapping[str, Sequence[str]] | None = None,
                 segments: Mapping[str, Sequence[int]] | None = None) -> TimeReport:
    """Predicted seconds of ``plan`` (a :class:`~sdplan.core.planning.plan_types.Plan`) on
    ``inventory``'s devices (module docstring).

    Args:
        plan: the resolved plan (modules' runtime devices and residency).
        inventory: devices with their profiles (None: defaults) and drives.
        profile: the model's sizes (weight bytes per module; the formula's parameters).
        settings: size, batch, steps, sampler, guidance, CPU threads.
        works: module -> counted work (:mod:`sdplan.core.pipelines.work`); modules missing
            here use the formula.
        model_paths: module -> model file paths (absolute), for their drives' speeds.
        segments: module -> bytes of each ``--max-vram`` segment (the memory estimate's).

    Returns:
        A :class:`TimeReport`.
    """
    prof = _Profiles(inventory, settings.threads)
    notes: list[str] = []
    modules: dict[str, tuple[ModuleTime, ...]] = {}
    per_device: dict[str, float] = {}
    phase_s = {"text": 0.0, "step": 0.0, "decode": 0.0}
    stage_use = {"text": 0.0, "step": 0.0, "decode": 0.0}
    load_s = 0.0
    mods = getattr(plan, "modules", {})
    for module in [*PRICED, *(m for m in mods if m not in PRICED)]:
        mplan = mods.get(module)
        if mplan is None or profile is None or profile.get(module) is None:
            continue  # a module this model set does not have
        devices = list(mplan.devices)
        mw = list((works or {}).get(module) or [])
        copy_on = ""
        if not mw:
            mw = formula_work(module, profile, settings, devices[0])
            if mw:
                notes.append(f"{module}: work by formula from its parameter count (its graphs not "
                             "counted: no model files, or the reason noted)")
            cfgp = getattr(plan, "cfg", None)
            if mw and module == "diffusion" and settings.cfg and cfgp is not None and cfgp.active:
                copy_on = cfgp.device
                mw = parallel_cfg_formula(mw, devices[0], copy_on)
        if not mw:
            notes.append(f"{module}: not priced (no count of its graphs and no formula for it); "
                         "its time is left out")
            continue
        paths = [p for p in (model_paths or {}).get(module, ()) if p]
        drive = drive_for(paths[0], inventory.drives) if paths else drive_for("/", inventory.drives)
        if drive.source == "default" and paths:  # one note per folder, however many files it holds
            note = (f"the drive of {paths[0].rsplit('/', 1)[0] or '/'} has no measured profile; stated "
                    "defaults (sdplan devices --calibrate --drive FOLDER)")
            if note not in notes:
                notes.append(note)
        weights = _weights(mw, devices, profile.get(module).total)  # type: ignore[union-attr]
        mode = mplan.params.mode
        params_dev = mplan.params.device or devices[0]
        load = stage = 0.0
        if mode == "runtime":
            load = sum(_read_s(prof, drive, d, n, b) for d, (n, b) in weights.items())
        elif mode == "device":
            n_all, b_all = sum(n for n, _ in weights.values()), sum(b for _, b in weights.values())
            load = _read_s(prof, drive, params_dev, n_all, b_all)
            stage = sum(_stage_s(prof, params_dev, d, n, b) for d, (n, b) in weights.items())
        else:  # disk: read per use
            stage = sum(_read_s(prof, drive, d, n, b) for d, (n, b) in weights.items())
        segs = (segments or {}).get(module) or ()
        per_call_stage = 0.0
        if len(segs) > 1:
            src = params_dev if mode == "device" else None
            nb = sum(segs)
            n_t = max(1, int(sum(n for n, _ in weights.values()) * nb / max(sum(b for _, b in weights.values()), 1)))
            per_call_stage = (_stage_s(prof, src, devices[0], n_t, nb) if src else
                              _read_s(prof, drive, devices[0], n_t, nb))
            notes.append(f"{module}: {len(segs)} --max-vram segments moved on every call")
        times = []
        together: dict[tuple[str, str], float] = {}  # graphs run at the same time: the slowest counts
        for i, w in enumerate(mw):
            call = graph_seconds(w.graph, prof)
            if per_call_stage:
                call["segments"] = per_call_stage
            calls = w.calls * (settings.evaluations if w.phase == "step" else 1)
            copy = i == 1 and bool(copy_on)  # parallel CFG's copy: its weights on its own device
            copy_load = (sum(_read_s(prof, drive, copy_on, n, b) for n, b in weights.values())
                         if copy and mode == "runtime" else 0.0)
            t = ModuleTime(module, w.phase, call, calls,
                           (stage if i == 0 or copy else 0.0) + alloc_seconds(w.graph, prof),
                           load if i == 0 else copy_load, w.source)
            times.append(t)
            if w.group:
                group = (w.phase, w.group)
                slowest = max(together.get(group, 0.0), t.calls * t.call_total)
                phase_s[w.phase] += slowest - together.get(group, 0.0)
                together[group] = slowest
            else:
                phase_s[w.phase] += t.calls * t.call_total
            stage_use[w.phase] += t.stage_s
            load_s += t.load_s
            uses = settings.steps if w.phase == "step" else 1
            for d, sec in call.items():
                key = d if d in prof.inventory else devices[0]
                per_device[key] = per_device.get(key, 0.0) + sec * calls * uses
        modules[module] = tuple(times)
    step = phase_s["step"]
    return TimeReport(step_s=step, text_s=phase_s["text"] + stage_use["text"],
                      sampling_s=step * settings.steps + stage_use["step"],
                      decode_s=phase_s["decode"] + stage_use["decode"], load_s=load_s,
                      modules=modules, devices=per_device, settings=settings,
                      notes=tuple(dict.fromkeys([*prof.notes, *notes])), profiles=dict(prof.sources))


def predict_fitted(plan: object, inventory: Inventory, profile: Profile | None, settings: RunSettings,
                   fit: object = None) -> TimeReport:
    """:func:`predict_time` of ``plan`` by the formula (no counted work, no model files) with
    the ``--max-vram`` segments of its estimate ``fit`` (a
    :class:`~sdplan.core.planning.estimate.FitReport`, or None)."""
    segments = {m: list(e.segments) for m, e in (getattr(fit, "modules", None) or {}).items()
                if getattr(e, "segments", ())}
    return predict_time(plan, inventory, profile, settings, None, None, segments)


def drive_of_files(files: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Module -> model file paths from sd-cli model flags (``model`` serves every module;
    ``diffusion_model``, ``vae``, and the encoders' files their modules)."""
    out: dict[str, list[str]] = {}
    for key, paths in files.items():
        mods = {"model": ("te", "diffusion", "vae"), "diffusion_model": ("diffusion",), "vae": ("vae",)}.get(
            key, ("te",) if re.match(r"^(clip_l|clip_g|t5xxl|llm)$", key) else ())
        for m in mods:
            out.setdefault(m, []).extend(paths)
    return out


__all__ = ["RunSettings", "ModuleTime", "TimeReport", "predict_time", "predict_fitted", "formula_work", "graph_seconds",
           "device_seconds", "op_seconds", "drive_of_files", "seconds_text", "Link"]
