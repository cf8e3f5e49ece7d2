"""Another machine's devices are counted on CPU backends standing in for them: a device that is
not a CPU (an RPC server, a GPU) stands in as such (``Backend.stand_in``), so its graphs take
ggml's own ops as on the device and the work names the kernels its profile measured. Counted as
a plain CPU, an RPC device's UNet took this CPU's kernels (sdplan's attention and Winograd
convolutions), which its profile does not have, and the demo's step on an RPC server was priced
at a third of its time."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from conftest import REPO, require_or_skip
from rpc_util import PYTHON, rpc_servers

G = pytest.importorskip("sdplan._ggml")
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
EXAMPLE = REPO / "resources" / "inventories" / "epyc-2core-rpc-100mbps.json"
BACKEND = ["--backend", "te=CPU,diffusion=RPC0,vae=CPU"]


def _kernels(works) -> set[tuple[str, str, str]]:
    """(device, class, kernel) of every op of the diffusion model's first graph."""
    g = works["diffusion"][0].graph
    return {(d, o.cls, o.kernel) for d, dw in g.devices.items() for o in dw.ops}


def _count(accelerators):
    from sdplan.core.modelfiles.checkpoint import read_model_files
    from sdplan.core.pipelines.work import count_plan
    from sdplan.core.planning.inventory import Inventory
    from sdplan.core.planning.plan import resolve

    inv = Inventory.from_json(json.loads(EXAMPLE.read_text()))
    files = {"model": [str(DEMO)]}
    plan = resolve(BACKEND, inv, read_model_files(files).profile())
    return count_plan(files, plan, [d.name for d in inv], width=128, height=128, accelerators=accelerators)


def test_a_device_that_is_not_a_cpu_is_counted_with_ggmls_own_ops() -> None:
    ops = _count(["RPC0"])
    kernels = {k for d, _, k in _kernels(ops) if d == "RPC0"}
    assert "FLASH_ATTN_EXT@d8" in kernels and "FLASH_ATTN_EXT@d8k77" in kernels and "FLASH_ATTN_EXT@d12" in kernels
    assert {k for k in kernels if k.startswith("MUL_MAT@c")}  # convolutions as im2col and a product
    assert not {k for k in kernels if "attention" in k or k.startswith("winograd")}
    cpu = {k for d, _, k in _kernels(_count([])) if d == "RPC0"}
    assert cpu != kernels  # as a CPU it takes this CPU's kernels
    # the stand-ins are the count's own: a plain CPU backend made afterwards is a CPU again
    b = G.init_backend("CPU")
    assert not b.stand_in and G.Graph([b]).main_cpu


@pytest.mark.rpc
def test_the_stand_in_counts_what_the_rpc_server_runs() -> None:
    """The same plan counted live on an RPC server (in a process of its own: ggml ends a client
    whose server goes) names the same ops, kernels and FLOP as on the stand-in."""
    from sdplan.core.runtime import devices

    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    code = textwrap.dedent("""
        import json, sys
        from sdplan.core.modelfiles.checkpoint import read_model_files
        from sdplan.core.pipelines.work import count_plan
        from sdplan.core.planning.plan import resolve
        from sdplan.core.runtime.devices import add_rpc_servers, live_inventory
        add_rpc_servers([sys.argv[1]])
        inv = live_inventory()
        files = {"model": [sys.argv[2]]}
        plan = resolve(json.loads(sys.argv[3]), inv, read_model_files(files).profile())
        works = count_plan(files, plan, [d.name for d in inv], width=128, height=128, live=True)
        g = works["diffusion"][0].graph
        print(json.dumps(sorted([d, o.cls, o.kernel, o.dtype, o.flops, o.count]
                                for d, dw in g.devices.items() for o in dw.ops)))
    """)
    with rpc_servers(1) as (srv,):
        done = subprocess.run([PYTHON, "-c", code, srv.endpoint, str(DEMO), json.dumps(BACKEND)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout.strip().splitlines()[-1])
    g = _count(["RPC0"])["diffusion"][0].graph
    stand_in = sorted([d, o.cls, o.kernel, o.dtype, o.flops, o.count] for d, dw in g.devices.items() for o in dw.ops)
    assert stand_in == live
