"""Property tests of the planner (hypothesis).

- any plan round-trips through its canonical strings (and through GUI edits);
- random flag values never raise anything but :class:`PlanError`;
- error spans always lie inside the flag value they point into.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import MODULE_KEYS
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.modules import MODULES
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import INPUT_ONLY_WARNINGS, resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import ModuleProfile, Profile

GIB = 1 << 30
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    n_gpu = draw(st.integers(0, 4))
    devs = [Device(f"CUDA{i}", f"gpu {i}", "gpu", "CUDA", draw(st.integers(0, 48)) * GIB // 2,
                   48 * GIB) for i in range(n_gpu)]
    if draw(st.booleans()):
        devs.append(Device("Vulkan0", "igpu", "igpu", "Vulkan", 2 * GIB, 4 * GIB))
    if draw(st.booleans()):
        devs.append(Device("BLAS", "blas", "accel", "BLAS", 0, 0))
    devs.append(Device("CPU", "cpu", "cpu", "CPU", 32 * GIB, 64 * GIB))
    for i in range(draw(st.integers(0, 2))):
        devs.append(Device(f"RPC{i}", "192.0.2.1:50052", "gpu", "RPC", 8 * GIB, 8 * GIB))
    return Inventory(tuple(devs))


DEVICE_WORDS = ["cuda0", "CUDA1", "cuda", "Cuda2", "cpu", "CPU", "vulkan", "Vulkan0", "blas",
                "rpc", "RPC1", "gpu", "auto", "default", "c", "r", "v", "metal", "cuda3"]
KEYS = sorted(MODULE_KEYS) + ["Clip-Vision", "T5_XXL", "all", "*", "DEFAULT"]
NUMBERS = ["4", "6.5", ".5", "5.", "+4", "1e1", "-1", "-2.5", "0", "12", "-100"]


def entries(values: st.SearchStrategy[str], keys: list[str]) -> st.SearchStrategy[str]:
    entry = st.one_of(values, st.tuples(st.sampled_from(keys), values).map("=".join))
    return st.lists(entry, max_size=6).map(",".join)


runtime_values = st.one_of(
    st.sampled_from(DEVICE_WORDS[:-4] + ["auto"]),
    st.lists(st.sampled_from(DEVICE_WORDS[:11]), min_size=1, max_size=3).map("&".join))
params_values = st.sampled_from(DEVICE_WORDS[:12] + ["disk", "DISK", "auto"])
vram_keys = ["cuda0", "CUDA1", "cuda", "gpu", "auto", "cpu", "Vulkan0", "rpc1", "all"]


@st.composite
def profiles(draw: st.DrawFn) -> Profile | None:
    if not draw(st.booleans()):
        return None
    mods = {}
    for m in ("diffusion", "te"):
        blocks = draw(st.lists(st.integers(0, 4 * GIB), max_size=12))
        mods[m] = ModuleProfile(tuple(blocks), draw(st.integers(0, 2 * GIB)))
    return Profile(mods)


def same_plan(a: Plan, b: Plan) -> None:
    assert {m: a.modules[m] for m in MODULES} == {m: b.modules[m] for m in MODULES}
    assert a.budgets == b.budgets
    assert (a.backend, a.params_backend, a.max_vram) == (b.backend, b.params_backend,
                                                         b.max_vram)
    keep = [w for w in a.warnings if w.code not in INPUT_ONLY_WARNINGS]
    assert keep == [w for w in b.warnings if w.code not in INPUT_ONLY_WARNINGS]


def from_plan_strings(plan: Plan) -> Placement:
    return Placement.from_strings(plan.backend, plan.params_backend, plan.max_vram,
                                  stream_layers=plan.stream_layers,
                                  rpc_servers=list(plan.rpc_servers))


@SETTINGS
@given(inv=inventories(), profile=profiles(), backend=entries(runtime_values, KEYS),
       params=entries(params_values, KEYS), vram=entries(st.sampled_from(NUMBERS), vram_keys),
       flags=st.lists(st.booleans(), min_size=5, max_size=5))
def test_plans_round_trip_through_their_strings(inv: Inventory, profile: Profile | None,
                                                backend: str, params: str, vram: str,
                                                flags: list[bool]) -> None:
    try:
        plan = resolve(Placement.from_strings(
            backend, params, vram, stream_layers=flags[0], clip_on_cpu=flags[1],
            vae_on_cpu=flags[2], control_net_cpu=flags[3], offload_to_cpu=flags[4]),
            inv, profile)
    except PlanError:
        assume(False)
        return
    again = resolve(from_plan_strings(plan), inv, profile)
    same_plan(plan, again)
    same_plan(plan, resolve(plan.placement, inv, profile))
    assert again.placement == plan.placement


EDITS = st.lists(st.tuples(
    st.sampled_from(["assign", "add", "remove", "residency", "budget", "default"]),
    st.sampled_from(list(MODULES)), st.integers(0, 10), st.sampled_from(["runtime", "disk",
                                                                          "device"]),
    st.sampled_from([None, -1.5, 0, 3, 6.5])), max_size=8)


@SETTINGS
@given(inv=inventories(), profile=profiles(), edits=EDITS)
def test_gui_edits_round_trip(inv: Inventory, profile: Profile | None, edits: list) -> None:
    names = inv.names()
    pl = resolve(Placement(), inv, profile).placement
    for op, module, i, mode, gib in edits:
        dev = names[i % len(names)]
        try:
            if op == "assign":
                pl = pl.assign(module, dev)
            elif op == "add":
                pl = pl.add_split_device(module, dev)
            elif op == "remove":
                pl = pl.remove_split_device(module, dev)
            elif op == "residency":
                pl = pl.set_residency(module, mode, dev)
            elif op == "budget":
                pl = pl.set_budget(dev if i % 3 else None, gib)
            else:
                pl = pl.set_default(dev)
        except PlanError:
            continue
        plan = resolve(pl, inv, profile)
        same_plan(plan, resolve(from_plan_strings(plan), inv, profile))


text_or_flag = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=",=&*- _.+eE0123456789abcdtuvlpACDUGPRVk", max_size=40))


@SETTINGS
@given(inv=inventories(), backend=text_or_flag, params=text_or_flag, vram=text_or_flag,
       flags=st.lists(st.booleans(), min_size=5, max_size=5))
def test_random_strings_raise_only_plan_errors_with_spans_inside(
        inv: Inventory, backend: str, params: str, vram: str, flags: list[bool]) -> None:
    try:
        resolve(Placement.from_strings(
            backend, params, vram, stream_layers=flags[0], clip_on_cpu=flags[1],
            vae_on_cpu=flags[2], control_net_cpu=flags[3], offload_to_cpu=flags[4]), inv)
    except PlanError as exc:
        values = {"--backend": backend, "--params-backend": params, "--max-vram": vram}
        if exc.span is not None:
            assert exc.flag in values
            assert exc.text == values[exc.flag]
            start, end = exc.span
            assert 0 <= start < end <= len(exc.text)
            piece = exc.text[start:end]
            assert piece == piece.strip() and piece


@SETTINGS
@given(argv=st.lists(st.sampled_from(["--backend", "--params-backend", "--max-vram",
                                      "--rpc-servers", "--stream-layers", "--clip-on-cpu",
                                      "--offload-to-cpu", "te=cpu", "-1", "cuda0&cuda1",
                                      "x", "disk", "vae=cuda1", "4"]), max_size=10))
def test_random_argument_lists_raise_only_plan_errors(argv: list[str]) -> None:
    inv = Inventory((Device("CUDA0", "g", "gpu", "CUDA", 8 * GIB, 8 * GIB),
                     Device("CUDA1", "g", "gpu", "CUDA", 8 * GIB, 8 * GIB),
                     Device("CPU", "c", "cpu", "CPU", 8 * GIB, 8 * GIB)))
    try:
        resolve(argv, inv)
    except PlanError:
        pass
