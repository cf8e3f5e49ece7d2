"""``--auto-fit``: sdplan predicts sd-cli's own choice (spec section 13).

Every case of ``../shared/cases/autofit_cases.jsonl`` was recorded from sd-cli (97d2990)
itself on real-size model layouts; here the same layouts are written as sparse safetensors
files, the same devices are given as an inventory, and ``sdplan plan --auto-fit ... --json``
must print sd-cli's strings and plan their devices and residency.
"""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.planning.autofit import MIB, RESERVES, auto_fit, autofit_budget
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile

CASES = Path(__file__).resolve().parent.parent.parent / "shared" / "cases" / \
    "autofit_cases.jsonl"
SIZE = {"BF16": 2, "F16": 2, "F32": 4}


def _cases() -> list[dict]:
    if not CASES.is_file():
        return [{"id": "no-shared-cases"}]
    return [json.loads(x) for x in CASES.read_text(encoding="utf-8").splitlines() if x.strip()]


def write_sparse(path: Path, shapes: dict[str, list[int]], dtype: str, prefix: str = "",
                 dtypes: dict[str, str] | None = None) -> None:
    """A safetensors header listing ``shapes`` (names prefixed), data region sparse."""
    header, off = {}, 0
    for name, shape in shapes.items():
        dt = (dtypes or {}).get(name, dtype)
        n = math.prod(shape) * SIZE[dt]
        header[prefix + name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(max(off - 1, 0), 1)
        fh.write(b"\0")


def inventory_json(path: Path, rpc_devices: list[dict]) -> Path:
    devs = [{"name": "CPU", "description": "CPU", "type": "cpu", "registry": "CPU",
             "free": 64 * GIB, "total": 64 * GIB}]
    devs += [{"name": d["name"], "description": f"127.0.0.1:{50052 + i}", "type": "gpu",
              "registry": "RPC", "free": d["free_mib"] * MIB, "total": d["free_mib"] * MIB}
             for i, d in enumerate(rpc_devices)]
    path.write_text(json.dumps({"devices": devs}))
    return path


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    return json.loads((shared_dir / "models" / "real_size_key_layouts.json").read_text())


@pytest.mark.shared
@pytest.mark.parametrize("case", _cases(), ids=[c["id"] for c in _cases()])
def test_auto_fit_gives_sd_clis_choice(case: dict, layouts, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--devices", str(inventory_json(tmp_path / "inv.json", case["rpc_devices"])),
            "--auto-fit"]
    for i, (flag, key, dtype) in enumerate(case["files"]):
        path = tmp_path / f"{i}_{key}.safetensors"
        write_sparse(path, layouts[key], dtype, prefix="text_model." if key == "clip_l_hf" else "")
        argv += [flag, str(path)]
    argv += [*case["flags"], "--json"]
    code = cli.main(argv)
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    fit = out["auto_fit"]
    assert (fit["backend"], fit["params_backend"]) == \
        (case["expect"]["backend"], case["expect"]["params_backend"])
    assert fit["time_share"] == case["time_share"]
    assert "auto_fit_overrides" not in [w["code"] for w in out["warnings"]]
    # the plan is the one sd-cli's strings give when pinned explicitly (same files, devices)
    pinned = [a for a in argv if a not in ("--auto-fit", "--json")]
    pinned += ["--backend", fit["backend"], "--params-backend", fit["params_backend"], "--json"]
    assert cli.main(pinned) == 0
    want = json.loads(capsys.readouterr().out)
    assert out["modules"] == want["modules"]
    assert out["fit"] == want["fit"]


def test_budget_rules() -> None:
    free = 24105 * MIB
    assert autofit_budget(free, None) == free - 512 * MIB
    assert autofit_budget(free, Decimal(0)) == free - 512 * MIB
    assert autofit_budget(free, Decimal(6)) == 6 * GIB
    assert autofit_budget(free, Decimal(100)) == free
    assert autofit_budget(free, Decimal(-4)) == free - 4 * GIB
    assert autofit_budget(MIB, None) == 0


def _inv(*free_gib: float, igpu: bool = False) -> Inventory:
    devs = [{"name": f"CUDA{i}", "description": "", "type": "igpu" if igpu else "gpu",
             "registry": "CUDA", "free": int(g * GIB), "total": int(g * GIB)}
            for i, g in enumerate(free_gib)]
    devs.append({"name": "CPU", "description": "", "type": "cpu", "registry": "CPU",
                 "free": 64 * GIB, "total": 64 * GIB})
    return Inventory.from_json({"devices": devs})


def test_resident_prefers_most_room_and_keeps_reserves() -> None:
    # diffusion 10 GiB, te 5 GiB, vae 0.3 GiB on 24 + 12 GiB
    comp = {"diffusion": 10 * GIB, "te": 5 * GIB, "vae": 300 * MIB}
    fit = auto_fit(comp, _inv(24, 12))
    assert not fit.time_share
    # diffusion -> CUDA0 (most room); te: CUDA0 room 13.5, CUDA1 11.5 -> CUDA0 fits
    # (10 + 5 + 2 <= 23.5); vae: CUDA0 room 8.5 < CUDA1 11.5 -> CUDA1
    assert fit.backend == "diffusion=CUDA0,te=CUDA0,vae=CUDA1" and fit.params_backend == ""


def test_time_share_split_and_cpu() -> None:
    comp = {"diffusion": 30 * GIB, "te": 9 * GIB, "vae": 300 * MIB}
    fit = auto_fit(comp, _inv(12, 16))
    # resident fails; diffusion: too big for one, capacity (11.5-2)+(15.5-2)=23 < 30 -> cpu
    # te: 9 + 2 fits the largest budget (CUDA1); vae -> CUDA1 (largest budget)
    assert fit.time_share
    assert fit.backend == "diffusion=cpu,te=CUDA1,vae=CUDA1"
    assert fit.params_backend == "te=disk,vae=disk"
    split = auto_fit({"diffusion": 20 * GIB, "te": 0, "vae": 0}, _inv(12, 16))
    assert split.backend == "diffusion=CUDA1&CUDA0" and split.params_backend == "diffusion=disk"


def test_no_gpu_and_integrated_gpus_leave_the_default() -> None:
    fit = auto_fit({"diffusion": GIB, "te": GIB, "vae": GIB}, _inv(8, igpu=True))
    assert fit.devices == () and fit.backend == "" and fit.params_backend == ""


def test_plan_with_auto_fit_warns_and_writes_the_switch() -> None:
    prof = Profile({"diffusion": ModuleProfile((GIB,) * 4, GIB), "te": ModuleProfile((), GIB),
                    "vae": ModuleProfile((), 100 * MIB)})
    pl = Placement.from_strings("te=cpu", "", "", auto_fit=True)
    plan = resolve(pl, _inv(24, 12), prof)
    assert "auto_fit_overrides" in plan.warning_codes()
    assert plan.auto_fit is not None and plan.auto_fit.components["diffusion"] == 5 * GIB
    # resident on budgets 23.5 and 11.5 GiB: diffusion 5 -> CUDA0; te 1: room 18.5 on
    # CUDA0 against 11.5 -> CUDA0; vae likewise
    assert plan.auto_fit.backend == "diffusion=CUDA0,te=CUDA0,vae=CUDA0"
    assert plan.modules["te"].devices == ["CUDA0"]
    # the placement to edit and write is --auto-fit, not the derived strings
    assert plan.placement.auto_fit and plan.placement.to_strings()["backend"] == ""
    again = resolve(plan.placement, _inv(24, 12), prof)
    assert again.modules == plan.modules
    # without a model there is nothing to size
    bare = resolve(pl, _inv(24, 12))
    assert "auto_fit_needs_model" in bare.warning_codes() and bare.auto_fit is None
    assert RESERVES == {"diffusion": 2048 * MIB, "te": 2048 * MIB, "vae": 1024 * MIB}


@pytest.mark.shared
@pytest.mark.parametrize("embed_dtype,warns", [("BF16", True), ("F16", False)])
def test_warns_when_the_loaded_encoder_outgrows_auto_fits_count(
        embed_dtype: str, warns: bool, layouts, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Z-Image on two 10 GiB budgets: auto-fit counts the BF16 Qwen3 at 7.5 GiB, so te + its
    # 2 GiB reserve fits RPC0's 10 GiB; sd-cli loads the BF16 token embedding as F32 (0.7
    # GiB more), which does not fit. An F16 embedding is read as it is: no warning.
    inv = inventory_json(tmp_path / "inv.json", [{"name": "RPC0", "free_mib": 24105},
                                                  {"name": "RPC1", "free_mib": 24105}])
    files = []
    for flag, key, dtype in (("--diffusion-model", "z_image_turbo", "BF16"),
                             ("--llm", "qwen3_4b_hf", "BF16"), ("--vae", "flux1_ae_bfl", "F32")):
        path = tmp_path / f"{key}.safetensors"
        write_sparse(path, layouts[key], dtype,
                     dtypes={"model.embed_tokens.weight": embed_dtype})
        files += [flag, str(path)]
    code = cli.main(["plan", "--devices", str(inv), "--auto-fit", *files,
                     "--max-vram", "RPC0=10,RPC1=10", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["auto_fit"]["backend"] == "diffusion=RPC0&RPC1,te=RPC0,vae=RPC0"
    found = [w["message"] for w in out["warnings"] if w["code"] == "auto_fit_will_not_fit"]
    if warns:
        assert len(found) == 1 and "RPC0: te needs" in found[0] and "as loaded" in found[0]
    else:
        assert found == []
