"""The plan that runs is the plan the user saw: a plan made, then a device removed (an RPC
server stopped) or shrunk (less free memory than the plan was made with) before running gives
one clear message naming the difference, before anything loads."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest
from rpc_util import rpc_servers
from sdplan.core.errors import EngineError
from sdplan.core.pipelines.demo.model import demo_model_path
from sdplan.core.pipelines.job_names import GENERATE_JOB, INVENTORY_JOB
from sdplan.core.pipelines.request import planned_request
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.runtime.run_plan import DeviceNeed

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags  # noqa: E402
from sdplan.core.pipelines import jobs  # noqa: E402
from sdplan.core.runtime.devices import live_inventory  # noqa: E402

SETTINGS = {"prompt": "a red circle on a blue background", "width": 64, "height": 64, "steps": 2,
            "threads": 1, "previews": False}
FILES = {"model": [str(demo_model_path())]}

def _planned(inventory: Inventory, backend: str = "", rpc: tuple[str, ...] = ()):  # noqa: ANN202
    profile = profile_from_model_flags(FILES)
    plan = resolve(Placement.from_strings(backend, "", "", rpc_servers=list(rpc)), inventory, profile)
    fit = estimate_plan(plan, profile, inventory, width=64, height=64, batch=1)
    return planned_request(SETTINGS, FILES, plan, fit, inventory)

class _Ctx:
    """The engine job context generate_job needs, in this process; its pool must never be used."""

    def __init__(self) -> None:
        self.cancel = None
        self.progress = lambda **_: None
        self.preview = lambda _: None

    def add_rpc_servers(self, endpoints):  # noqa: ANN001, ANN201
        return []

    def pool(self):  # noqa: ANN201
        raise AssertionError("the engine loaded something before the plan was checked")

def test_a_device_with_less_free_memory_than_planned_is_named(monkeypatch) -> None:
    live = live_inventory()
    cpu = live.get("CPU")
    req = _planned(live)
    need = req.plan.devices[0]
    assert need.name == "CPU" and req.plan.differences(live) == []
    # the plan was made on a machine whose CPU had room for 10x more than this one has free now
    grown = DeviceNeed("CPU", cpu.description, cpu.free * 2, cpu.free * 10)
    req = replace(req, plan=replace(req.plan, devices=(grown,)))
    monkeypatch.setattr(jobs, "_pipeline", lambda fam: pytest.fail("the family's pipeline ran"))
    with pytest.raises(EngineError) as exc:
        jobs.generate_job(_Ctx(), req)
    text = str(exc.value)
    assert "\n" not in text and text.startswith("the devices changed since the plan was made: CPU (")
    assert "the plan needs" in text and "when planned" in text

def test_a_device_the_plan_names_but_the_machine_lacks_is_named(monkeypatch) -> None:
    live = live_inventory()
    req = _planned(live)
    placements = {m: replace(p, devices=("CUDA7",)) for m, p in req.plan.placements.items()}
    req = replace(req, plan=replace(req.plan, placements=MappingProxyType(placements)))
    monkeypatch.setattr(jobs, "_pipeline", lambda fam: pytest.fail("the family's pipeline ran"))
    with pytest.raises(EngineError, match="since the plan was made: CUDA7 is gone"):
        jobs.generate_job(_Ctx(), req)

@pytest.mark.rpc
def test_an_rpc_server_stopped_after_planning_is_named() -> None:
    from sdplan.core.runtime.process import Engine

    with rpc_servers(1) as servers:
        endpoint = servers[0].endpoint
        with Engine() as engine:  # RPC clients live in a child process (ggml aborts a lost one)
            inventory = Inventory.from_json(engine.call(INVENTORY_JOB, {"rpc_servers": [endpoint]}))
        req = _planned(inventory, "RPC0", (endpoint,))
        assert [n.name for n in req.plan.devices] == ["RPC0"]
        assert req.plan.devices[0].description == endpoint
    # the server has stopped: the run refuses before it loads anything
    with Engine() as engine, pytest.raises(EngineError) as exc:
        engine.call(GENERATE_JOB, {"request": req})
    text = str(exc.value)
    assert "\n" not in text
    assert f"the devices changed since the plan was made: RPC0 ({endpoint}) is gone" in text
    assert "Start the RPC server again" in text

def test_a_plan_still_valid_runs() -> None:
    from sdplan.core.runtime.process import Engine

    with Engine() as engine:
        inventory = Inventory.from_json(engine.call(INVENTORY_JOB, {"rpc_servers": []}))
        req = _planned(inventory)
        res = engine.call(GENERATE_JOB, {"request": req})
    assert res["images"][0].shape == (64, 64, 3)
    assert res["placements"]["diffusion"]["devices"] == ["CPU"] and res["plan"]["backend"] == "CPU"
