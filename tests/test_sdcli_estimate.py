"""The newest sd-cli's accounting (spec sections 14.5-14.7): 512 MiB of scratch at every
capacity check, 128 MiB more to choose segments, its fixed graph-cut segment list, the VAE
retry with tiles and the parallel-CFG copy of diffusion. Figures are worked by hand from
the estimate's documented formulas (an unknown architecture's compute is a quarter of its
weights at 512x512; the VAE's is ``4 * (latent**2 + 4 * 128 * pixels)`` plus the F16
``im2col`` columns ``2 * 9 * 128 * pixels``)."""

from __future__ import annotations

import pytest
from sdplan.core.planning.estimate import RuntimeFlags
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli_estimate import graph_cut_segments, sdcli_estimate
from sdplan.core.planning.target import Target
from sdplan.core.planning.vae_tiling import VaeTiling

MIB = 1 << 20
NEWEST = Target("sd-cli", "newest", True, "test")
SNAPSHOT = Target("sd-cli", "snapshot", True, "test")


def inv(*gpus: float) -> Inventory:
    devs = [{"name": f"CUDA{i}", "type": "gpu", "registry": "CUDA", "free": int(g * GIB),
             "total": int(g * GIB)} for i, g in enumerate(gpus)]
    devs.append({"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 * GIB,
                 "total": 64 * GIB})
    return Inventory.from_json({"devices": devs})


# a DiT of an unknown architecture: 40 blocks of 256 MiB and 512 MiB else (10.5 GiB);
# compute = 10.5 / 4 = 2.625 GiB at 512x512
DIT = Profile({"diffusion": ModuleProfile((256 * MIB,) * 40, 512 * MIB)})


def run(args: list[str], profile: Profile, devices: Inventory, target: Target = NEWEST,
        **kw):  # noqa: ANN003, ANN201
    plan = resolve(Placement.from_args(args), devices, profile, target)
    return sdcli_estimate(plan, profile, devices, flags=RuntimeFlags(im2col=False), **kw)


def test_offloaded_weights_run_in_the_fixed_segment_list() -> None:
    # CUDA0 12 GiB free: 11.5 GiB left after scratch. Weights in RAM: missing 10.5 + compute
    # 2.625 + 0.125 > 11.5, so sd-cli runs every segment: 40 blocks + prelude + tail = 42.
    # At its peak: the 512 MiB non-block weights, the current and the prefetched block
    # (2 x 256 MiB) and compute: 3.625 GiB
    fit, fc = run(["--backend", "CUDA0", "--params-backend", "diffusion=cpu"], DIT, inv(12))
    f = fc.modules["diffusion"]
    assert (f.segments, f.need, f.available) == (42, int(3.625 * GIB), int(11.5 * GIB))
    assert fit.fits and fc.scratch == 512 * MIB
    assert fit.devices["CUDA0"].staging == 1024 * MIB
    # --disable-prefetch keeps one block; --disable-segmented-compute runs it whole
    _, nopf = run(["--backend", "CUDA0", "--params-backend", "diffusion=cpu",
                   "--disable-prefetch"], DIT, inv(12))
    assert nopf.modules["diffusion"].need == int(3.375 * GIB)
    whole, wfc = run(["--backend", "CUDA0", "--params-backend", "diffusion=cpu",
                      "--disable-segmented-compute"], DIT, inv(12))
    assert wfc.modules["diffusion"].segments == 1 and not whole.fits
    assert wfc.modules["diffusion"].need == int(13.125 * GIB)
    assert any("monolithic" in r for r in whole.reasons)


def test_the_planning_headroom_tips_a_graph_into_segments() -> None:
    # weights 9.16 GiB in RAM + compute 2.29 GiB = 11.45 GiB: under the 11.5 GiB left, but
    # not with the 128 MiB planning headroom: segmented (a plain fit would say monolithic)
    blocks = (int(9.16 * GIB) // 40,) * 40
    prof = Profile({"diffusion": ModuleProfile(blocks, int(9.16 * GIB) - sum(blocks))})
    _, fc = run(["--backend", "CUDA0", "--params-backend", "diffusion=cpu"], prof, inv(12))
    assert fc.modules["diffusion"].segments == 42
    # 9.0 GiB (11.25 GiB with compute) leaves more than the headroom: monolithic
    blocks = (9 * GIB // 40,) * 40
    prof = Profile({"diffusion": ModuleProfile(blocks, 9 * GIB - sum(blocks))})
    _, fc = run(["--backend", "CUDA0", "--params-backend", "diffusion=cpu"], prof, inv(12))
    assert fc.modules["diffusion"].segments == 1


def test_scratch_is_kept_at_every_check() -> None:
    # resident 9.44 GiB + compute 2.36 GiB = 11.8 GiB on 12 GiB: the snapshot's estimate
    # fits, the newest's keeps 512 MiB and does not
    prof = Profile({"diffusion": ModuleProfile((), int(9.44 * GIB))})
    snap, none = run(["--backend", "CUDA0", "--auto-fit", "off"], prof, inv(12), SNAPSHOT)
    assert snap.fits and none is None
    new, _ = run(["--backend", "CUDA0", "--auto-fit", "off"], prof, inv(12))
    assert not new.fits and "less 0.50 GiB of scratch" in new.reasons[0]


def vae_need(w: int, h: int) -> int:
    latent = (w // 8) * (h // 8)
    return 4 * (latent * latent + 4 * 128 * w * h) + 2 * 9 * 128 * w * h


VAE = Profile({"vae": ModuleProfile((), 300 * MIB)}, architecture="sdxl")


def test_a_failed_vae_decode_is_retried_with_tiles() -> None:
    # 1024x1024 whole: 5.25 GiB; 4 GiB free leave 3.5 - 0.29 GiB of weights: retried with
    # 256 px tiles (289,406,976 bytes)
    assert vae_need(1024, 1024) == int(5.25 * GIB) and vae_need(256, 256) == 289_406_976
    devices = inv(4)
    plan = resolve(Placement.from_args(["--backend", "CUDA0", "--auto-fit", "off"]), devices,
                   VAE, NEWEST)
    fit, fc = sdcli_estimate(plan, VAE, devices, width=1024, height=1024)
    assert fc.vae.to_json() == {"tile_px": [256, 256], "retried": True, "fits": True}
    assert fit.devices["CUDA0"].compute == vae_need(256, 256) and fit.fits
    # with room to spare it decodes whole
    big = inv(16)
    plan = resolve(Placement.from_args(["--backend", "CUDA0", "--auto-fit", "off"]), big,
                   VAE, NEWEST)
    _, whole = sdcli_estimate(plan, VAE, big, width=1024, height=1024)
    assert whole.vae.tile == (0, 0) and not whole.vae.retried
    # --vae-tiling with 512 px tiles tiles from the start
    fit, tiled = sdcli_estimate(plan, VAE, big, width=1024, height=1024,
                                tiling=VaeTiling(True, (512, 512)))
    assert tiled.vae.tile == (512, 512) and fit.devices["CUDA0"].compute == vae_need(512, 512)


def test_the_cfg_device_holds_a_second_copy() -> None:
    devices = inv(24, 24)
    prof = Profile({"diffusion": ModuleProfile((GIB,) * 8, 0)})
    fit, fc = run(["--backend", "CUDA0,cfg=CUDA1", "--auto-fit", "off"], prof, devices)
    assert fc.cfg_device == "CUDA1"
    # 8 GiB on each device, and the 2 GiB compute (8 / 4) on both
    assert fit.devices["CUDA1"].weights == 8 * GIB == fit.devices["CUDA0"].weights
    assert fit.devices["CUDA1"].compute == 2 * GIB
    # weights in RAM: the RAM copy doubles, the CFG device stages its copy
    ram, _ = run(["--backend", "CUDA0,cfg=CUDA1", "--params-backend", "diffusion=cpu"], prof,
                 devices)
    assert ram.devices["CPU"].weights == 16 * GIB
    assert ram.devices["CUDA1"].staging == 8 * GIB and ram.devices["CUDA1"].weights == 0
    # sequential (cfg on the diffusion device): no copy
    same, sfc = run(["--backend", "CUDA0,cfg=CUDA0", "--auto-fit", "off"], prof, devices)
    assert sfc.cfg_device is None and "CUDA1" not in same.devices


def test_segment_counts() -> None:
    assert graph_cut_segments(ModuleProfile((1,) * 57, 1)) == 59  # FLUX.1: 19 + 38 blocks
    sdxl_stages = (1,) * 18  # 8 input blocks, the middle block, 9 output blocks
    assert graph_cut_segments(ModuleProfile((), 100, stages=sdxl_stages)) == 18
    assert graph_cut_segments(ModuleProfile((), 100)) == 1


@pytest.mark.parametrize("dialect", ["snapshot", "newest"])
def test_engine_and_snapshot_keep_the_plain_estimate(dialect: str) -> None:
    target = Target("sd-cli", dialect, True, "t") if dialect == "snapshot" else Target()
    fit, fc = run(["--backend", "CUDA0", "--params-backend", "diffusion=cpu"], DIT, inv(12),
                  target)
    assert fc is None and fit.engine == "sd-cli"
