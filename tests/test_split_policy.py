"""The split policy in the plan (spec sections 14.3-14.5): ``--split-ratio`` parsed and
checked with spans, sd-cli's own ranges for an sd-cli target (the first device filled first;
a UNet's segments spread too), section 8's for sdplan's engine, and the parallel-CFG device
with the cases where sd-cli stays sequential."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.errors import PlanError
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli_split import fill_first, ratio_ranges, sdcli_capacities
from sdplan.core.planning.split_ratio import parse_split_ratio
from sdplan.core.planning.target import Target
from sparse_writer import FIXTURES as WAN  # the tiny Wan expert pair: a two-stage model

MIB = 1 << 20
NEWEST = Target("sd-cli", "newest", True, "test")
SNAPSHOT = Target("sd-cli", "snapshot", True, "test")


def inv(*free_mib: int) -> Inventory:
    devs = [{"name": f"RPC{i}", "type": "gpu", "registry": "RPC", "free": f * MIB,
             "total": f * MIB} for i, f in enumerate(free_mib)]
    devs.append({"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 * GIB,
                 "total": 64 * GIB})
    return Inventory.from_json({"devices": devs})


def spans(plan, module: str) -> list[tuple[str, int, int]]:  # noqa: ANN001
    return [(r.device, r.first_block, r.last_block) for r in plan.modules[module].ranges]


@pytest.mark.parametrize(("text", "kind", "ratios"), [
    ("auto", "auto", ()), (" VRAM ", "vram", ()), ("3,1", "ratios", (3, 1)),
    ("0.5, .25,0", "ratios", (Decimal("0.5"), Decimal(".25"), 0)), ("", None, None)])
def test_split_ratio_values(text: str, kind: str | None, ratios) -> None:  # noqa: ANN001
    got = parse_split_ratio(text)
    if kind is None:
        assert got is None
        return
    assert got.kind == kind and got.ratios == tuple(Decimal(r) for r in ratios)


@pytest.mark.parametrize(("text", "span"), [
    ("3,,1", (2, 2)), ("3, x", (3, 4)), ("3,-1", (2, 4)), ("2GiB", (0, 4)), ("inf", (0, 3)),
    ("0,0", (0, 3))])
def test_split_ratio_errors_have_spans(text: str, span: tuple[int, int]) -> None:
    with pytest.raises(PlanError) as exc:
        parse_split_ratio(text)
    assert exc.value.code == "invalid_split_ratio" and exc.value.span == span
    assert exc.value.flag == "--split-ratio"


def test_ratio_count_must_match_the_device_list(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(inv(8192, 8192).to_json()))
    code = cli.main(["plan", "--devices", str(path), "--backend", "diffusion=RPC0&RPC1",
                     "--split-ratio", "1,2,3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["error"]["code"] == "invalid_split_ratio"
    assert out["error"]["span"] == [0, 5] and "3 ratios for diffusion's 2 devices" in \
        out["error"]["message"]
    plan = resolve(Placement.from_strings("RPC0", split_ratio="vram"), inv(8192, 8192))
    assert "split_ratio_unused" in plan.warning_codes()


def test_fixed_ratios_place_block_bytes() -> None:
    # 4 equal blocks, 3:1 -> cumulative bounds 3 and 4 blocks; midpoints 0.5, 1.5, 2.5 <= 3
    units = [GIB] * 4
    assert ratio_ranges(["A", "B"], [Decimal("0.75"), Decimal("0.25")], units) == \
        ratio_ranges(["A", "B"], parse_split_ratio("3,1").fractions(), units)
    got = ratio_ranges(["A", "B"], parse_split_ratio("3,1").fractions(), units)
    assert [(r.device, r.first_block, r.last_block, r.bytes) for r in got] == \
        [("A", 0, 2, 3 * GIB), ("B", 3, 3, GIB)]
    # a zero ratio leaves a device out
    zero = ratio_ranges(["A", "B", "C"], parse_split_ratio("1,0,1").fractions(), units)
    assert [(r.device, r.first_block, r.last_block) for r in zero] == [("A", 0, 1), ("C", 2, 3)]
    prof = Profile({"diffusion": ModuleProfile((GIB,) * 4, 0)})
    plan = resolve(Placement.from_strings("diffusion=RPC0&RPC1", split_ratio="1,3"),
                   inv(24000, 24000), prof)
    assert spans(plan, "diffusion") == [("RPC0", 0, 0), ("RPC1", 1, 3)]
    assert plan.to_json()["split_ratio"] == {"kind": "ratios", "ratios": [1.0, 3.0],
                                             "text": "1,3"}


# A Qwen3-4B encoder as sd-cli splits it (spec 14.3): its F32 token embedding (151936 x 2560,
# 1483.75 MiB) in the first segment, then 35 layers of 100.9 M bf16 parameters.
QWEN_LAYER = (2560 * 4096 * 2 + 2560 * 1024 * 2 + 3 * 2560 * 9728) * 2
QWEN = Profile({"te": ModuleProfile((QWEN_LAYER,) * 35, 151936 * 2560 * 4)})


def test_snapshot_fills_the_first_device_up_to_its_budget() -> None:
    # recorded from sd-cli (spec 14.3): two 8192 MiB budgets put 8029 MB, segments [0, 35)
    # (the embedding and 34 layers), on the first and one segment on the second
    plan = resolve(Placement.from_strings("te=RPC0&RPC1", max_vram="RPC0=8,RPC1=8"),
                   inv(24105, 24105), QWEN, SNAPSHOT)
    assert spans(plan, "te") == [("RPC0", 0, 33), ("RPC1", 34, 34)]
    first = plan.modules["te"].main_other_bytes + plan.modules["te"].ranges[0].bytes
    assert abs(first / MIB - 8029) < 5
    # capacities: min(free - 2 GiB, budget)
    assert sdcli_capacities([24105 * MIB, 3000 * MIB], [8 * GIB, 0], "snapshot") == \
        [8 * GIB, 952 * MIB]


def test_newest_keeps_two_gib_of_headroom_and_streams_the_excess() -> None:
    # newest: capacity = budget - 2 GiB = 6144 MiB; the embedding (1483.75 MiB) and 24
    # layers (192.4 MiB each: 6101 MiB) fit the first, 11 layers go to the second
    plan = resolve(Placement.from_strings("te=RPC0&RPC1", max_vram="RPC0=8,RPC1=8"),
                   inv(24105, 24105), QWEN, NEWEST)
    assert spans(plan, "te") == [("RPC0", 0, 23), ("RPC1", 24, 34)]
    assert not any(r.streamed for r in plan.modules["te"].ranges)
    assert "split_ratio_auto" in plan.warning_codes()
    # 4 GiB budgets keep 2048 MiB each; the 8218 MiB module's excess (4122 MiB) is spread
    # 1:1, so each device takes up to 4109 MiB: the embedding and 13 layers (3985 MiB) on
    # the first, the 22 others (4233 MiB) on the second; what is beyond 2048 MiB streams
    tight = resolve(Placement.from_strings("te=RPC0&RPC1", max_vram="RPC0=4,RPC1=4"),
                    inv(24105, 24105), QWEN, NEWEST)
    r0, r1 = tight.modules["te"].ranges
    assert (r0.first_block, r0.last_block, r1.first_block, r1.last_block) == (0, 12, 13, 34)
    assert round(r0.streamed / MIB) == round((151936 * 2560 * 4 + 13 * QWEN_LAYER) / MIB - 2048)
    assert round(r1.streamed / MIB) == round(22 * QWEN_LAYER / MIB - 2048)
    assert "split_streams" in tight.warning_codes()
    # the snapshot cannot hold it: it stops, and the plan says so
    snap = resolve(Placement.from_strings("te=RPC0&RPC1", max_vram="RPC0=4,RPC1=4"),
                   inv(24105, 24105), QWEN, SNAPSHOT)
    assert "split_over_capacity" in snap.warning_codes()


def test_sdplans_engine_keeps_section_8_ranges() -> None:
    plan = resolve(Placement.from_strings("te=RPC0&RPC1", max_vram="RPC0=8,RPC1=8"),
                   inv(24105, 24105), QWEN)
    # section 8: equal weights (8 - 2 GiB each), shares of 8218 MiB / 2 = 4109 MiB; RPC0's
    # share less the 1484 MiB embedding (2625 MiB) holds 13 layers (2501 MiB), not 14
    assert spans(plan, "te") == [("RPC0", 0, 12), ("RPC1", 13, 34)]
    # --split-ratio vram asks for sd-cli's fill on the engine too (newest capacities)
    vram = resolve(Placement.from_strings("te=RPC0&RPC1", max_vram="RPC0=8,RPC1=8",
                                          split_ratio="vram"), inv(24105, 24105), QWEN)
    assert spans(vram, "te") == [("RPC0", 0, 23), ("RPC1", 24, 34)]


def test_fill_first_moves_on_past_a_device_that_holds_nothing() -> None:
    ranges = fill_first(["A", "B", "C"], [GIB, GIB, GIB], [GIB // 2] * 4, 2 * GIB)
    # the fixed bytes fill A: every unit goes on; B takes two, C the rest
    assert [(r.device, r.first_block, r.last_block) for r in ranges] == [("B", 0, 1),
                                                                          ("C", 2, 3)]


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict:
    return json.loads((shared_dir / "models" / "real_size_key_layouts.json").read_text())


@pytest.mark.shared
def test_sdxl_over_two_devices_spreads_unet_segments(layouts, tmp_path: Path,  # noqa: ANN001
                                                     capsys) -> None:  # noqa: ANN001
    """The held-back auto-fit case (SDXL, 6 GiB budgets on two RPC devices): sd-cli chose
    ``diffusion=RPC0&RPC1`` and cut the UNet's graph into segments on both devices; the
    plan for an sd-cli target keeps both devices and spreads the UNet's stages."""
    from test_autofit import inventory_json, write_sparse

    model = tmp_path / "sdxl.safetensors"
    write_sparse(model, layouts["sdxl_base_ldm_full"], "F16")
    devices = inventory_json(tmp_path / "inv.json", [{"name": "RPC0", "free_mib": 24105},
                                                     {"name": "RPC1", "free_mib": 24105}])
    base = ["plan", "--devices", str(devices), "-m", str(model), "--max-vram", "RPC0=6,RPC1=6",
            "--json"]
    assert cli.main([*base, "--auto-fit"]) == 0
    fitted = json.loads(capsys.readouterr().out)["auto_fit"]
    assert fitted["backend"] == "diffusion=RPC0&RPC1,te=RPC0,vae=RPC0"
    pinned = [*base, "--backend", fitted["backend"], "--params-backend", fitted["params_backend"]]
    assert cli.main([*pinned, "--sdcli-dialect", "newest"]) == 0
    out = json.loads(capsys.readouterr().out)
    diffusion = out["modules"]["diffusion"]
    assert diffusion["devices"] == ["RPC0", "RPC1"] and diffusion["range_unit"] == "stage"
    assert [r["device"] for r in diffusion["ranges"]] == ["RPC0", "RPC1"]
    # the newest keeps 2 GiB of each 6 GiB budget: RPC0 holds at most 4 GiB of the UNet
    first = diffusion["main_other_bytes"] + diffusion["ranges"][0]["bytes"]
    assert first <= 4 * GIB and sum(r["bytes"] for r in diffusion["ranges"]) > 4 * GIB - first
    assert "no_blocks" not in [w["code"] for w in out["warnings"]]
    # the snapshot keeps the list too (no no_blocks fallback); its 6 GiB capacity holds the
    # whole 4.78 GiB UNet on RPC0
    assert cli.main([*pinned, "--sdcli-dialect", "snapshot"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["modules"]["diffusion"]["devices"] == ["RPC0", "RPC1"]
    assert "device_gets_no_blocks" in [w["code"] for w in snap["warnings"]]
    # sdplan's engine runs a UNet on its first device, and says what sd-cli does instead
    assert cli.main(pinned) == 0
    engine = json.loads(capsys.readouterr().out)
    assert engine["modules"]["diffusion"]["devices"] == ["RPC0"]
    msg = next(w["message"] for w in engine["warnings"] if w["code"] == "no_blocks")
    assert "sd-cli instead cuts its graph into segments and spreads them over RPC0 & RPC1" in msg


D = Inventory.from_json({"devices": [
    {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 24 << 30, "total": 24 << 30},
    {"name": "CUDA1", "type": "gpu", "registry": "CUDA", "free": 24 << 30, "total": 24 << 30},
    {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 << 30, "total": 64 << 30}]})


def test_cfg_device() -> None:
    plan = resolve(Placement.from_strings("CUDA0,cfg=cuda1"), D)
    assert plan.to_json()["cfg"] == {"device": "CUDA1", "active": True, "reasons": []}
    assert plan.backend == "CUDA0,cfg=CUDA1"
    same = resolve(Placement.from_strings("CUDA0,cfg=CUDA0"), D)
    assert not same.cfg.active and "cfg_sequential" in same.warning_codes()
    assert "diffusion device CUDA0 itself" in same.cfg.reasons[0]
    snap = resolve(Placement.from_strings("CUDA0,cfg=CUDA1"), D, None, SNAPSHOT)
    assert not snap.cfg.active and "snapshot" in snap.cfg.reasons[0]
    with_cn = resolve(Placement.from_strings("CUDA0,cfg=CUDA1"), D,
                      Profile({"diffusion": ModuleProfile((GIB,), 0),
                               "controlnet": ModuleProfile((), GIB)}))
    assert with_cn.cfg.reasons == ("the model has ControlNet",)


@pytest.mark.parametrize(("backend", "params", "code", "span"), [
    ("CUDA0,cfg=CUDA0&CUDA1", "", "invalid_cfg_device", (10, 21)),
    ("CUDA0,cfg=cuda9", "", "device_not_found", (10, 15)),
    ("CUDA0", "cfg=cpu", "invalid_assignment", (0, 3)),
    ("CUDA0,cfg=disk", "", "disk_not_runtime", (10, 14)),
])
def test_cfg_errors(backend: str, params: str, code: str, span: tuple[int, int]) -> None:
    with pytest.raises(PlanError) as exc:
        resolve(Placement.from_strings(backend, params), D)
    assert exc.value.code == code and exc.value.span == span


def test_commands_that_keep_cfg_sequential(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(D.to_json()))
    for extra, reason in (("--cfg-scale 1", "--cfg-scale 1"), ("--cache-mode easycache",
                                                               "--cache-mode"),
                          (f"--diffusion-model {WAN}/wan_tiny.safetensors --high-noise-diffusion-model "
                           f"{WAN}/wan_high_noise_tiny.safetensors", "high-noise")):
        assert cli.main(["plan", "--devices", str(path), "--command",
                         f"sd-cli --backend CUDA0,cfg=CUDA1 -p cat {extra}", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["cfg"]["active"] is False and reason in out["cfg"]["reasons"][0], extra
        assert "cfg=CUDA1" in out["command"]["written"]
    assert cli.main(["plan", "--devices", str(path), "--command",
                     "sd-cli --backend CUDA0,cfg=CUDA1 -p cat --cfg-scale 5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cfg"]["active"] is True
