"""The cost model (:mod:`sdplan.core.planning.timing`) against its formula written out by
hand: per device compute, memory and fixed costs; inputs, outputs and split copies over
each device's links; weights by residency; steps, samplers and guidance; CPU thread
scaling, stated defaults and the parameter-count formula."""

from __future__ import annotations

import pytest
from sdplan.core.planning.device_profile import DEFAULTS, DeviceProfile, DriveProfile, Link
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.timing import (
    RPC_TENSOR_BYTES,
    UNET_TOKENS_PER_LATENT_PX,
    RunSettings,
    predict_time,
)
from sdplan.core.planning.work import DeviceWork, GraphWork, ModuleWork, OpGroup

GB = 10**9
CPU_P = DeviceProfile({"mm:f16": ((1.0, 1e11),)}, mem_bps=1e10, node_s=1e-6, graph_s=1e-4,
                      h2d=Link(1e10, 0.0), d2h=Link(1e10, 0.0), threads=2, op_s=2e-6)
RPC_P = DeviceProfile({"mm:f16": ((1.0, 4e10),), "mm/MUL_MAT:f16": ((1.0, 5e10),)}, mem_bps=5e9, node_s=2e-6,
                      graph_s=1e-3, h2d=Link(1e8, 1e-4), d2h=Link(2e8, 2e-3))
DRIVE = DriveProfile("/models", 5e8, 4e9, 2e10)
PROFILE = Profile({"te": ModuleProfile((), 200_000_000), "diffusion": ModuleProfile((), 1_700_000_000),
                   "vae": ModuleProfile((), 160_000_000)}, name="sd15", architecture="sd1")


def _inv(cpu: DeviceProfile | None = CPU_P, rpc: DeviceProfile | None = RPC_P) -> Inventory:
    return Inventory((Device("CPU", "cpu", "cpu", "CPU", 16 * GB, 32 * GB, profile=cpu),
                      Device("RPC0", "127.0.0.1:1", "gpu", "RPC", 16 * GB, 32 * GB, profile=rpc)), (DRIVE,))


def _works(dev: str) -> dict[str, list[ModuleWork]]:
    def g(flops: float, mem: float, nodes: int, wbytes: int, **kw: object) -> GraphWork:
        return GraphWork(dev, {dev: DeviceWork((OpGroup("mm", "MUL_MAT", "f16", flops, 10),), mem, nodes, 100,
                                               wbytes, 20)}, **kw)  # type: ignore[arg-type]
    return {"te": [ModuleWork("te", "text", g(1e9, 1e6, 50, 200_000_000), 2)],
            "diffusion": [ModuleWork("diffusion", "step", g(1e10, 1e8, 1000, 1_700_000_000, input_bytes=500_000,
                                                             inputs=3, output_bytes=30_000, outputs=1), 1)],
            "vae": [ModuleWork("vae", "decode", g(4e10, 4e8, 300, 160_000_000), 1)]}


def _device_s(p: DeviceProfile, flops: float, rate: float, mem: float, nodes: int) -> float:
    return 10 * flops / rate + mem / p.mem_bps + 20 * p.op_s + nodes * p.node_s + p.graph_s


PATHS = {m: ["/models/sd15.safetensors"] for m in ("te", "diffusion", "vae")}


def test_a_cpu_plan_sums_compute_memory_and_fixed_costs() -> None:
    plan = resolve(["--backend", "CPU"], _inv(), PROFILE)
    s = RunSettings(512, 512, 1, 20, "euler", True, 2)
    rep = predict_time(plan, _inv(), PROFILE, s, _works("CPU"), PATHS)
    step = _device_s(CPU_P, 1e10, 1e11, 1e8, 1000)
    text = 2 * _device_s(CPU_P, 1e9, 1e11, 1e6, 50)
    decode = _device_s(CPU_P, 4e10, 1e11, 4e8, 300)
    assert rep.step_s == pytest.approx(step)
    assert (rep.text_s, rep.decode_s, rep.sampling_s) == pytest.approx((text, decode, 20 * step))
    # a CPU maps its weights: each page touched once at load
    assert rep.load_s == pytest.approx((200e6 + 1700e6 + 160e6) / DRIVE.map_bps)
    assert rep.image_s == pytest.approx(rep.load_s + text + 20 * step + decode)
    assert rep.notes == () and rep.profiles == {"CPU": "measured"}
    assert rep.to_json()["step_s"] == rep.step_s and rep.to_json()["image_s"] == rep.image_s


def test_an_rpc_device_pays_its_link_for_inputs_outputs_and_weights() -> None:
    plan = resolve(["--backend", "RPC0"], _inv(), PROFILE)
    rep = predict_time(plan, _inv(), PROFILE, RunSettings(steps=10, sampler="euler"), _works("RPC0"), PATHS)
    io = 3 * 1e-4 + 500_000 / 1e8 + 2e-3 + 30_000 / 2e8
    records = (100 + 3) * RPC_TENSOR_BYTES / 1e8  # its weights' and inputs' records go with the graph
    step = _device_s(RPC_P, 1e10, 5e10, 1e8, 1000) + io + records  # the kernel's own rate (MUL_MAT)
    assert rep.step_s == pytest.approx(step)
    # runtime weights: read from the page cache and uploaded tensor by tensor, once
    upload = sum(b / DRIVE.cached_bps + 100 * 1e-4 + b / 1e8 for b in (200e6, 1700e6, 160e6))
    assert rep.load_s == pytest.approx(upload)


def test_residency_moves_weights_once_per_use() -> None:
    inv = _inv()
    staged = resolve(["--backend", "te=CPU,diffusion=RPC0,vae=CPU", "--params-backend", "diffusion=CPU"], inv,
                     PROFILE)
    works = {**_works("CPU"), "diffusion": _works("RPC0")["diffusion"]}
    base = predict_time(resolve(["--backend", "te=CPU,diffusion=RPC0,vae=CPU"], inv, PROFILE), inv, PROFILE,
                        RunSettings(steps=10), works, PATHS)
    rep = predict_time(staged, inv, PROFILE, RunSettings(steps=10), works, PATHS)
    stage = 100 * 1e-4 + 1.7e9 / 1e8  # RAM to RPC0, tensor by tensor: once per sampling loop
    assert rep.step_s == pytest.approx(base.step_s)
    assert rep.sampling_s == pytest.approx(base.sampling_s + stage)
    assert rep.modules["diffusion"][0].load_s == pytest.approx(1.7e9 / DRIVE.map_bps)  # into RAM, mapped
    disk = predict_time(resolve(["--backend", "CPU", "--params-backend", "diffusion=disk"], inv, PROFILE), inv,
                        PROFILE, RunSettings(steps=10), _works("CPU"), PATHS)
    cpu = predict_time(resolve(["--backend", "CPU"], inv, PROFILE), inv, PROFILE, RunSettings(steps=10),
                       _works("CPU"), PATHS)
    assert disk.sampling_s == pytest.approx(cpu.sampling_s + 1.7e9 / DRIVE.map_bps)  # mapped again per use
    assert disk.load_s == pytest.approx(cpu.load_s - 1.7e9 / DRIVE.map_bps)


def test_memory_bound_ops_are_priced_by_their_kernels_rates() -> None:
    from sdplan.core.planning.timing import device_seconds

    p = DeviceProfile({"mm:f16": ((1.0, 1e11),)}, mem_bps=1e10, node_s=0.0, graph_s=0.0, h2d=Link(1.0, 0.0),
                      d2h=Link(1.0, 0.0), mem_rates={"SILU": ((1e6, 2e9),)})
    dw = DeviceWork(mem_bytes=3e8, mem_kernels={"SILU": (1e8, 50), "ADD": (2e8, 50)})
    assert device_seconds(p, dw) == pytest.approx(1e8 / 2e9 + 2e8 / 1e10)
    assert device_seconds(p, DeviceWork(mem_bytes=3e8)) == pytest.approx(3e8 / 1e10)  # no breakdown


def test_split_copies_cross_the_links_and_cpu_sides_are_host_memory() -> None:
    gw = GraphWork("RPC0", {"RPC0": DeviceWork(), "CPU": DeviceWork()}, copies={"RPC0>CPU": 10**6, "CPU>RPC0": 10**6})
    from sdplan.core.planning.timing import _Profiles, graph_seconds

    got = graph_seconds(gw, _Profiles(_inv(), 0))
    assert got["copies"] == pytest.approx(2e-3 + 1e6 / 2e8 + 1e-4 + 1e6 / 1e8)


def test_samplers_guidance_and_steps_multiply_the_right_calls() -> None:
    inv = _inv()
    plan = resolve(["--backend", "CPU"], inv, PROFILE)
    euler = predict_time(plan, inv, PROFILE, RunSettings(steps=8, sampler="euler"), _works("CPU"), PATHS)
    heun = predict_time(plan, inv, PROFILE, RunSettings(steps=8, sampler="heun"), _works("CPU"), PATHS)
    assert heun.step_s == pytest.approx(2 * euler.step_s)  # two evaluations per step
    assert heun.modules["diffusion"][0].calls == 2 and heun.modules["te"][0].calls == 2


def test_a_cpu_profile_is_scaled_to_the_runs_threads_and_missing_profiles_are_stated() -> None:
    inv = _inv()
    plan = resolve(["--backend", "CPU"], inv, PROFILE)
    two = predict_time(plan, inv, PROFILE, RunSettings(threads=2), _works("CPU"), PATHS)
    one = predict_time(plan, inv, PROFILE, RunSettings(threads=1), _works("CPU"), PATHS)
    compute = 10 * 1e10 / 1e11 + 1e8 / 1e10
    assert one.step_s - two.step_s == pytest.approx(compute)  # products and memory at half the rate
    assert any("measured with 2 threads scaled to 1" in n for n in one.notes)
    bare = _inv(cpu=None, rpc=None)
    rep = predict_time(resolve(["--backend", "RPC0"], bare, PROFILE), bare, PROFILE, RunSettings(), _works("RPC0"),
                       PATHS)
    assert rep.profiles == {"RPC0": "default"}
    assert any(n.startswith("RPC0: no measured profile") for n in rep.notes)
    flops, mem, node, graph, link, lat = DEFAULTS["rpc"]
    assert rep.modules["diffusion"][0].call_s["RPC0"] == pytest.approx(
        10 * 1e10 / flops + 1e8 / mem + 1000 * node + graph + (100 + 3) * RPC_TENSOR_BYTES / link)


def test_without_a_count_the_parameter_formula_is_used_and_stated() -> None:
    inv = _inv()
    plan = resolve(["--backend", "CPU"], inv, PROFILE)
    rep = predict_time(plan, inv, PROFILE, RunSettings(512, 512, 1, 20, "euler", True, 2), {}, PATHS)
    params = 1.7e9 / 2
    unet = 2 * params * 64 * 64 * UNET_TOKENS_PER_LATENT_PX * 2  # CFG as a batch of 2
    assert rep.step_s == pytest.approx(unet / 1e11 + CPU_P.graph_s)
    assert any("work by formula" in n for n in rep.notes)
    flux = Profile({"diffusion": ModuleProfile((), 12_000_000_000)}, name="flux1-dev-q8_0", architecture="flux-dev")
    rep = predict_time(resolve(["--backend", "CPU"], inv, flux), inv, flux, RunSettings(1024, 1024, cfg=False), {}, {})
    tokens = (128 * 128) / 4 + 512
    assert rep.step_s == pytest.approx(2 * (12e9 / 1.0625) * tokens / 1e11 + CPU_P.graph_s)
    # Qwen-Image's DiT attends with the registry's 256 text tokens
    qwen = Profile({"diffusion": ModuleProfile((), 40_000_000_000)}, name="qwen-image-bf16", architecture="qwen_image")
    rep = predict_time(resolve(["--backend", "CPU"], inv, qwen), inv, qwen, RunSettings(1024, 1024, cfg=False), {}, {})
    assert rep.step_s == pytest.approx(2 * (40e9 / 2) * ((128 * 128) / 4 + 256) / 1e11 + CPU_P.graph_s)


def test_a_videos_frames_multiply_the_dits_tokens_and_add_their_attention() -> None:
    """Wan 2.2 A14B (registry width 5120, 512 text tokens; 40 blocks here): 81 frames at 832x480
    are 21 latent frames of 104 x 60 / 4 patches each; the step is the linear term over all
    of them plus 4 T^2 width FLOP of attention per block, and the decode works on every frame."""
    inv = _inv()
    blocks = (700_000_000,) * 40
    wan = Profile({"diffusion": ModuleProfile(blocks, 0), "vae": ModuleProfile((), 160_000_000)},
                  name="wan22-t2v-a14b-f16", architecture="wan-t2v_a14b")
    plan = resolve(["--backend", "CPU"], inv, wan)
    one = predict_time(plan, inv, wan, RunSettings(832, 480, cfg=False), {}, {})
    video = predict_time(plan, inv, wan, RunSettings(832, 480, cfg=False, frames=81), {}, {})
    params = 40 * 700e6 / 2
    t1 = 104 * 60 / 4 + 512
    assert one.step_s == pytest.approx(2 * params * t1 / 1e11 + CPU_P.graph_s)
    t81 = 104 * 60 / 4 * 21 + 512
    assert video.step_s == pytest.approx((2 * params * t81 + 4 * t81 ** 2 * 5120 * 40) / 1e11 + CPU_P.graph_s)
    assert video.step_s > 30 * one.step_s  # 21x the patches, and their attention as much again
    assert video.decode_s == pytest.approx(81 * (one.decode_s - CPU_P.graph_s) + CPU_P.graph_s, rel=1e-6)


def test_parallel_cfg_by_formula_runs_the_halves_at_once_and_loads_the_copy() -> None:
    """Without model files (a profile alone), ``cfg=RPC0`` splits the UNet's CFG batch into two
    halves, the conditional on the CPU and the unconditional on RPC0 at the same time (the
    slower counts), and the copy's weights are read onto RPC0 at load; without ``cfg=`` the
    batch of 2 runs on the CPU and nothing more is loaded."""
    inv = _inv()
    s = RunSettings(512, 512, 1, 20, "euler", True, 2)
    seq = predict_time(resolve(["--backend", "CPU"], inv, PROFILE), inv, PROFILE, s, {}, PATHS)
    plan = resolve(["--backend", "CPU,cfg=RPC0"], inv, PROFILE)
    assert plan.cfg is not None and plan.cfg.active
    par = predict_time(plan, inv, PROFILE, s, {}, PATHS)
    total = 2 * (1.7e9 / 2) * 64 * 64 * UNET_TOKENS_PER_LATENT_PX * 2
    cpu_half = total / 2 / 1e11 + CPU_P.graph_s
    rpc_half = total / 2 / 4e10 + RPC_P.graph_s + (1e-4 + 2e-3)  # its compute and an empty input/output trip
    assert seq.step_s == pytest.approx(total / 1e11 + CPU_P.graph_s)
    assert par.step_s == pytest.approx(max(cpu_half, rpc_half))
    assert [t.module for t in par.modules["diffusion"]] == ["diffusion", "diffusion"]
    copy_load = par.modules["diffusion"][1].load_s
    assert copy_load == pytest.approx(1.7e9 / DRIVE.cached_bps + RPC_P.h2d.seconds(1.7e9, 500))
    assert par.load_s == pytest.approx(seq.load_s + copy_load)


def test_a_planned_module_without_a_price_is_named_never_a_silent_zero() -> None:
    """An upscaler in the model set has neither a count nor a formula: its time is left out
    and the notes say so; a ControlNet's counted work is priced per evaluation like the UNet."""
    inv = _inv()
    prof = Profile({**PROFILE.modules, "upscaler": ModuleProfile((), 64_000_000),
                    "controlnet": ModuleProfile((), 700_000_000)}, name="sd15", architecture="sd1")
    plan = resolve(["--backend", "CPU"], inv, prof)
    works = _works("CPU")
    cn = GraphWork("CPU", {"CPU": DeviceWork((OpGroup("mm", "MUL_MAT", "f16", 3e9, 10),), 0.0, 0, 50, 700_000_000)})
    works["controlnet"] = [ModuleWork("controlnet", "step", cn, 1)]
    rep = predict_time(plan, inv, prof, RunSettings(512, 512, 1, 20, "euler", True, 2), works, PATHS)
    base = predict_time(resolve(["--backend", "CPU"], inv, PROFILE), inv, PROFILE,
                        RunSettings(512, 512, 1, 20, "euler", True, 2), _works("CPU"), PATHS)
    assert rep.step_s - base.step_s == pytest.approx(10 * 3e9 / 1e11 + CPU_P.graph_s)
    assert "upscaler: not priced (no count of its graphs and no formula for it); its time is left out" in rep.notes
    assert "upscaler" not in rep.modules


def test_a_hires_fix_is_named_as_not_priced() -> None:
    from sdplan.core.commands.time_estimate import unpriced
    from sdplan.core.pipelines.request import GenerationRequest

    plain = GenerationRequest.from_settings({"prompt": "p", "model_files": {"model": ["m.safetensors"]}})
    assert unpriced(plain) == [] and unpriced(None) == []
    hires = GenerationRequest.from_settings({"prompt": "p", "model_files": {"model": ["m.safetensors"]},
                                             "hires": True})
    assert [n.split(":")[0] for n in unpriced(hires)] == ["hires fix"]


def test_each_checkpoint_on_an_rpc_device_is_one_more_graph_round_trip() -> None:
    """A checkpoint cuts the compute into one more graph call: on an RPC device that is its
    round trip (the read-back's latency) and fixed graph cost each; on the CPU nothing; the
    count survives the work record's JSON."""
    from sdplan.core.planning.timing import _Profiles, graph_seconds
    from sdplan.core.runtime.graph import checkpoint_blocks

    plain = GraphWork("RPC0", {"RPC0": DeviceWork(nodes=10), "CPU": DeviceWork(nodes=4)})
    cut = GraphWork("RPC0", {"RPC0": DeviceWork(nodes=10), "CPU": DeviceWork(nodes=4)},
                    checkpoints={"RPC0": 3, "CPU": 2})
    prof = _Profiles(_inv(), 0)
    a, b = graph_seconds(plain, prof), graph_seconds(cut, prof)
    assert b["RPC0"] - a["RPC0"] == pytest.approx(3 * (1e-3 + 2e-3))
    assert b["CPU"] == a["CPU"]
    assert GraphWork.from_json(cut.to_json()) == cut
    assert GraphWork.from_json({k: v for k, v in plain.to_json().items() if k != "checkpoints"}) == plain
    assert [sorted(checkpoint_blocks(n)) for n in (0, 1, 2, 4, 15, 40)] == [
        [], [], [0], [0, 1, 2], [3, 7, 10], [9, 19, 29]]
