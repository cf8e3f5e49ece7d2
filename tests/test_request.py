"""The typed generation request and the run plan: building from sd-cli's keys, the check
against a family (defaults resolved, every refused option named with the family in one line),
what a picture records, JSON and pickle round trips, and the plan's comparison with live
devices (a device gone, shrunk, an RPC endpoint changed)."""

from __future__ import annotations

import pickle
from types import MappingProxyType

import pytest
from sdplan.core.errors import EngineError, InvalidArgument, ModelFileError
from sdplan.core.families import family
from sdplan.core.pipelines.request import (
    GenerationRequest,
    ModelOverrides,
    family_for,
    planned_request,
)
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.runtime.placement import ModulePlacement
from sdplan.core.runtime.run_plan import DeviceNeed, RunPlan

GIB = 1 << 30
SD1 = family("sd1")
FLUX = family("flux")


def req(**settings) -> GenerationRequest:
    return GenerationRequest.from_settings({"prompt": "a cat", **settings}, {"model": "m.safetensors"})


def test_defaults_come_from_the_family_and_variant() -> None:
    r = req().check(SD1)
    assert (r.width, r.height, r.steps, r.cfg_scale, r.sampling_method, r.clip_skip) == (512, 512, 20, 7.0, "euler_a", 1)
    f = GenerationRequest.from_settings({"prompt": "x"}, {"diffusion_model": "d", "t5xxl": "t", "clip_l": "c",
                                                          "vae": "v"})
    assert f.check(FLUX, "schnell").steps == 4 and f.check(FLUX, "dev").steps == 20
    assert f.check(FLUX).width == 512 and f.check(FLUX).guidance == 3.5
    given = req(width=640, steps=3, cfg_scale=2.5, sampling_method="heun").check(SD1)
    assert (given.width, given.steps, given.cfg_scale, given.sampling_method) == (640, 3, 2.5, "heun")
    assert family("sd2").defaults.clip_skip == 2 and req().check(family("sd2")).clip_skip == 2


def test_every_refused_option_is_named_with_the_family_in_one_line() -> None:
    with pytest.raises(InvalidArgument) as exc:
        req(guidance=5, slg_scale=2.0, ref_images=["r.png"]).check(SD1)
    text = str(exc.value)
    assert "\n" not in text and "SD 1.x does not take them" in text
    assert "--guidance 5" in text and "--slg-scale 2" in text and "-r/--ref-image" in text
    with pytest.raises(InvalidArgument, match=r"--guidance 5, --clip-skip 2: Chroma does not take them"):
        GenerationRequest.from_settings({"prompt": "x", "guidance": 5, "clip_skip": 2},
                                        {"diffusion_model": "d", "t5xxl": "t", "vae": "v"}).check(family("chroma"))
    # FLUX.1 runs real CFG with the negative prompt, as sd-cli
    GenerationRequest.from_settings({"prompt": "x", "negative_prompt": "y", "cfg_scale": 4},
                                    {"diffusion_model": "d", "t5xxl": "t", "clip_l": "c", "vae": "v"}).check(FLUX)
    # values equal to the family's default are no option at all
    GenerationRequest.from_settings({"prompt": "x", "cfg_scale": 1.0, "guidance": 3.5},
                                    {"diffusion_model": "d", "t5xxl": "t", "clip_l": "c", "vae": "v"}).check(FLUX)


def test_samplers_schedulers_and_files_are_checked_per_family() -> None:
    with pytest.raises(InvalidArgument, match="--sampling-method tcd: FLUX.1 does not run it"):
        GenerationRequest.from_settings({"prompt": "x", "sampling_method": "tcd"},
                                        {"diffusion_model": "d", "t5xxl": "t", "clip_l": "c", "vae": "v"}).check(FLUX)
    with pytest.raises(InvalidArgument, match="--scheduler flux: SD 1.x does not run it"):
        req(scheduler="flux").check(SD1)
    req(scheduler="karras", sampling_method="ddim").check(SD1)
    with pytest.raises(ModelFileError, match="a FLUX.1 run needs --diffusion-model, --t5xxl, --clip_l and --vae; "
                                             "missing --clip_l, --vae"):
        GenerationRequest.from_settings({"prompt": "x"}, {"diffusion_model": "d", "t5xxl": "t"}).check(FLUX)
    with pytest.raises(ModelFileError, match="a FLUX.2 dev run needs --diffusion-model, --llm and --vae; "
                                             "missing --llm"):
        GenerationRequest.from_settings({"prompt": "x"}, {"diffusion_model": "d", "vae": "v"}).check(family("flux2"))


def test_settings_record_exactly_what_runs() -> None:
    r = req(eta=0.5, sigmas="3,1,0", rng="cpu", extra_sample_args="gamma=0.1").check(SD1)
    s = r.settings(SD1)
    assert s["eta"] == 0.5 and s["sigmas"] == [3.0, 1.0, 0.0] and s["rng"] == "cpu"
    assert s["extra_sample_args"] == {"gamma": "0.1"}
    assert "guidance" not in s and "clip_skip" not in s  # SD 1.x takes no guidance; its own CLIP layer
    assert "lora_model_dir" not in s and "init_img" not in s and "timestep_shift" not in s
    assert req(clip_skip=2).check(SD1).settings(SD1)["clip_skip"] == 2


def test_json_and_pickle_round_trips() -> None:
    pl = RunPlan(MappingProxyType({"diffusion": ModulePlacement(("CPU",))}), (), {"backend": "CPU"},
                 (DeviceNeed("CPU", "AMD", 3 * GIB, 20 * GIB),))
    r = req(steps=3, sigmas=[2.0, 0.0], slg_scale=0.0, lora_model_dir="/l", overrides={"flux_axes": [2, 3, 3]},
            init_img="i.png", strength=0.4)
    r = GenerationRequest.from_settings(r.to_dict(), plan=pl)
    back = GenerationRequest.from_dict(r.to_dict())
    assert back == r and back.overrides == ModelOverrides(flux_axes=(2, 3, 3))
    assert pickle.loads(pickle.dumps(r)) == r
    assert back.plan.devices[0].needed == 3 * GIB


def _inventory(free_gib: float, rpc: str | None = None) -> Inventory:
    devs = [Device("CPU", "AMD", "cpu", "CPU", int(free_gib * GIB), 64 * GIB)]
    if rpc:
        devs.append(Device("RPC0", rpc, "gpu", "RPC", 8 * GIB, 8 * GIB))
    return Inventory.from_devices(devs)


def test_the_plan_names_a_device_gone_or_shrunk() -> None:
    profile = Profile({"diffusion": ModuleProfile((), 2 * GIB), "te": ModuleProfile((), GIB // 4),
                       "vae": ModuleProfile((), GIB // 8)}, architecture="sd1")
    planned = _inventory(20, "127.0.0.1:50052")
    plan = resolve(Placement.from_strings("diffusion=RPC0,te=CPU,vae=CPU", "", "", rpc_servers=["127.0.0.1:50052"]),
                   planned, profile)
    from sdplan.core.planning.estimate import estimate_plan

    fit = estimate_plan(plan, profile, planned, width=512, height=512, batch=1)
    r = planned_request({"prompt": "x"}, {"model": "m"}, plan, fit, planned)
    assert r.plan.differences(planned) == []
    gone = r.plan.differences(_inventory(20))
    assert gone == ["RPC0 (127.0.0.1:50052) is gone"]
    moved = r.plan.differences(_inventory(20, "127.0.0.1:50099"))
    assert moved == ["RPC0 is now 127.0.0.1:50099, not 127.0.0.1:50052"]
    need = next(n for n in r.plan.devices if n.name == "CPU").needed
    shrunk = r.plan.differences(_inventory(need / GIB / 2, "127.0.0.1:50052"))
    assert len(shrunk) == 1 and shrunk[0].startswith("CPU (AMD) has ") and "the plan needs" in shrunk[0]
    with pytest.raises(EngineError) as exc:
        r.plan.check(_inventory(20))
    assert str(exc.value).count("\n") == 0 and "since the plan was made: RPC0 (127.0.0.1:50052) is gone" in str(exc.value)
    err = r.plan.unreachable("RPC server 127.0.0.1:50052: connection refused")
    assert "RPC0 (127.0.0.1:50052) is gone (RPC server 127.0.0.1:50052: connection refused)" in str(err)


def test_family_for_runs_an_unknown_unet_as_sd() -> None:
    class Arch:
        family, variant = "unknown", None

    assert family_for(Arch())[0].name == "sd1"
