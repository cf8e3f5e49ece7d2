"""Every sd-cli command of the newest ``docs/backend.md`` and ``docs/performance.md``
(``tests/cases/newest_doc_commands.jsonl``, with the spec's ``--split-ratio`` and ``cfg=``
commands), round trip in both dialects: pasted, planned for sd-cli in that dialect, written
for it, pasted back: the same plan, and every argument sdplan does not plan the same, in the
same order. For the newest dialect the written placement flags are the pasted ones too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli import import_sdcli_command, kept_for_dialect, sdcli_command_line
from sdplan.core.planning.sdcli_write import placement_argv, written_placement
from sdplan.core.planning.target import Target, flag_in_dialect

DOCS = Path(__file__).parent / "cases" / "newest_doc_commands.jsonl"
LINES = [json.loads(x) for x in DOCS.read_text(encoding="utf-8").splitlines() if x.strip()]
HEADER, COMMANDS = LINES[0], LINES[1:]
INV = Inventory.from_json({"devices": [
    {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 24 * GIB, "total": 24 * GIB},
    {"name": "CUDA1", "type": "gpu", "registry": "CUDA", "free": 12 * GIB, "total": 12 * GIB},
    {"name": "Vulkan0", "type": "gpu", "registry": "Vulkan", "free": 8 * GIB, "total": 8 * GIB},
    {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 * GIB, "total": 64 * GIB}]})
# a 12 GiB DiT in 12 blocks, a 6 GiB encoder in 12 blocks, a small VAE
PROF = Profile({"diffusion": ModuleProfile((GIB,) * 12, 0),
                "te": ModuleProfile((GIB // 2,) * 12, 0),
                "vae": ModuleProfile((), GIB // 4)})


def plan_of(text: str, dialect: str):  # noqa: ANN201
    imp = import_sdcli_command(text)
    target = Target("sd-cli", dialect, True, "test")
    return imp, resolve(imp.placement, INV, PROF, target)


def summary(plan) -> dict:  # noqa: ANN001
    return {m: (mp.devices, mp.params, [(r.device, r.first_block, r.last_block)
                                         for r in mp.ranges]) for m, mp in plan.modules.items()}


def unplanned(imp) -> list:  # noqa: ANN001
    return [(a.flag, a.values) for a in imp.arguments if a.kind != "placement"]


def test_the_list_names_its_sources() -> None:
    assert HEADER["backend_commit"] == "0ba1080dd004c3e5f7a493859d0131c1a9a6b34d"
    assert len(COMMANDS) >= 30
    assert {c["doc"] for c in COMMANDS} == {"docs/backend.md", "docs/performance.md",
                                           "spec 14.4", "spec 14.5"}


@pytest.mark.parametrize("dialect", ["newest", "snapshot"])
@pytest.mark.parametrize("case", COMMANDS, ids=[f"{c['doc']}:{i}" for i, c in enumerate(COMMANDS)])
def test_round_trip(case: dict, dialect: str) -> None:
    imp, plan = plan_of(case["command"], dialect)
    placement, _ = written_placement(plan, dialect, INV, PROF)
    kept, dropped = kept_for_dialect(imp.extra_args(), dialect)
    line = sdcli_command_line(placement, imp.model_files, imp.generation, extra=kept,
                              raw=imp.generation_text, dialect=dialect)
    back, again = plan_of(line, dialect)
    assert summary(again) == summary(plan)
    assert (again.cfg is None) == (plan.cfg is None or dialect == "snapshot")
    # every argument sdplan does not plan comes back, in order, but for options the
    # dialect lacks (left out and named)
    want = [u for u in unplanned(imp) if not u[0].startswith("-") or flag_in_dialect(u[0], dialect)]
    assert unplanned(back) == want
    assert all(not flag_in_dialect(f, dialect) for f in dropped if f.startswith("--"))
    # every written flag exists in the dialect
    assert all(flag_in_dialect(a.flag, dialect) for a in back.arguments if a.known)
    # writing is stable
    placement2, _ = written_placement(again, dialect, INV, PROF)
    assert placement_argv(placement2, dialect) == placement_argv(placement, dialect)
    if dialect == "newest":
        # nothing is added to run it as planned: the pasted placement flags come back (with
        # exact device names, in canonical order)
        assert placement_argv(placement, "newest") == placement_argv(plan.placement, "newest")
        assert [a.flag for a in back.arguments if a.kind == "placement"] == \
            [f for f in placement_argv(imp.placement, "newest") if f.startswith("--")]


def test_the_issues_command_keeps_backend_and_off() -> None:
    imp, plan = plan_of('sd-cli --auto-fit off --backend "diffusion=cuda0&cuda1" --prompt cat',
                        "newest")
    assert plan.modules["diffusion"].devices == ["CUDA0", "CUDA1"]
    placement, _ = written_placement(plan, "newest", INV, PROF)
    assert sdcli_command_line(placement, imp.model_files, imp.generation,
                              extra=imp.extra_args(), dialect="newest") == (
        "sd-cli --backend 'diffusion=CUDA0&CUDA1' --auto-fit off --prompt cat")
