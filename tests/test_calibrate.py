"""Measured device and drive profiles (:mod:`sdplan.core.runtime.calibrate`): what a
measurement holds, where it is kept (:mod:`sdplan.core.runtime.profile_cache`), ``sdplan devices --calibrate``, a throttled RPC link
measured as throttled, and a plan for another machine's shipped inventory predicted
without touching this machine's devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from conftest import REPO, require_or_skip
from rpc_throttle import Throttle
from rpc_util import PYTHON, rpc_servers, sdplan_cmd
from sdplan.core.planning.device_profile import DeviceProfile, DriveProfile, Link
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.runtime import calibrate, profile_cache

EXAMPLE = REPO / "resources" / "inventories" / "epyc-2core-rpc-100mbps.json"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sdplan" / "device-profiles.json"


def _profile(threads: int, rate: float) -> DeviceProfile:
    return DeviceProfile({"mm:f16": ((1.0, rate),)}, 1e10, 1e-6, 1e-5, Link(1e9, 0.0), Link(1e9, 0.0), threads)


def test_profiles_are_kept_per_device_and_thread_count(cache) -> None:
    cpu = Device("CPU", "AMD EPYC", "cpu", "CPU", 1, 100)
    rpc = Device("RPC0", "10.0.0.2:50052", "gpu", "RPC", 1, 100)
    profile_cache.store(cpu, _profile(1, 5e10))
    profile_cache.store(cpu, _profile(2, 9e10))
    profile_cache.store(None, DriveProfile("/models", 1.0, 2.0, 3.0))
    assert json.loads(cache.read_text())["devices"][profile_cache.identity(cpu)].keys() == {"1", "2"}
    assert profile_cache.cached_profile(cpu, 1) == _profile(1, 5e10)
    assert profile_cache.cached_profile(cpu, 4) == _profile(2, 9e10)  # none for 4: the most threads
    assert profile_cache.cached_profile(rpc) is None
    # an RPC device is known by its endpoint, not by the name it got in this process
    profile_cache.store(rpc, _profile(0, 1e12))
    assert profile_cache.cached_profile(replace(rpc, name="RPC3")) == _profile(0, 1e12)
    inv = profile_cache.with_cached_profiles(Inventory((cpu, replace(rpc, profile=_profile(0, 7.0)))), 1)
    assert inv.get("CPU").profile == _profile(1, 5e10)
    assert inv.get("RPC0").profile == _profile(0, 7.0)  # an inventory file's own profile stays
    assert inv.drives == (DriveProfile("/models", 1.0, 2.0, 3.0),)


def test_a_damaged_cache_is_ignored(cache) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    cpu = Device("CPU", "x", "cpu", "CPU", 1, 2)
    assert profile_cache.cached_profile(cpu) is None and profile_cache.cached_drives() == ()
    profile_cache.store(cpu, _profile(1, 1.0))  # and is replaced by the next measurement
    assert profile_cache.cached_profile(cpu, 1) == _profile(1, 1.0)


def test_a_drive_is_read_cold_cached_and_mapped(tmp_path) -> None:
    d = calibrate.calibrate_drive(tmp_path, size=8 << 20)
    assert d.path == str(tmp_path.resolve()) and d.source == "measured"
    assert min(d.read_bps, d.cached_bps, d.map_bps) > 1e6  # a real drive reads more than 1 MB/s
    assert list(tmp_path.iterdir()) == []  # its test file is gone


def test_devices_calibrate_measures_keeps_and_prints_the_profiles(tmp_path) -> None:
    pytest.importorskip("sdplan._ggml")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(sdplan_cmd("devices", "--calibrate", "-t", "1", "--drive", str(tmp_path), "--json"),
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    prof = DeviceProfile.from_json(data["devices"][0]["profile"])
    assert prof.source == "measured" and prof.threads == 1
    for key in ("mm:f16", "mm:q8_0", "mm:f32", "conv:f16", "attn:f16"):
        assert all(w > 0 and r > 1e8 for w, r in prof.rates[key]), key  # more than 0.1 GFLOP/s
    assert prof.mem_bps > 1e8 and prof.h2d.bps > 1e7 and prof.node_s >= 0
    # cross-attention over CLIP's 77 tokens has rates of its own at each UNet width, the
    # demo's 4x4 level its width 12, and f32 -> f16 copies (flash attention's K and V) theirs
    kernels = {k.split(":")[0].split("@", 1)[-1] for k in prof.rates if k.startswith("attn/")}
    assert {"d8k77", "d40k77", "d64k77", "d12", "d8", "d40", "d64"} <= kernels, kernels
    assert "CPY" in prof.mem_rates
    assert data["drives"][0]["path"] == str(tmp_path.resolve())
    again = subprocess.run(sdplan_cmd("devices", "--json"), capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(again.stdout)["devices"][0]["profile"] == data["devices"][0]["profile"]  # kept
    table = subprocess.run(sdplan_cmd("devices"), capture_output=True, text=True, env=env, timeout=120)
    assert "CPU speed: f16 products" in table.stdout and "with 1 threads" in table.stdout


@pytest.mark.rpc
def test_an_rpc_device_behind_a_narrow_link_calibrates_to_that_link() -> None:
    """A server behind the throttling proxy at 100 MB/s and 1 ms each way: the measured
    bandwidth both ways is within a factor of 100 MB/s and reading back takes a round
    trip (2 ms)."""
    from sdplan.core.runtime import devices

    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    code = textwrap.dedent("""
        import json, sys
        from sdplan.core.runtime.calibrate import calibrate_device
        from sdplan.core.runtime.devices import BackendManager, add_rpc_servers
        name = add_rpc_servers([sys.argv[1]])[0]
        with BackendManager(cpu_threads=1) as m:
            p = calibrate_device(m, name, 1, parts=("links",))
        print(json.dumps([p.h2d.bps, p.d2h.bps, p.d2h.latency_s]))
    """)
    with rpc_servers(1) as (srv,), Throttle(("127.0.0.1", srv.port), 100, 1) as link:
        done = subprocess.run([PYTHON, "-c", code, link.endpoint], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    up, down, latency = json.loads(done.stdout)
    assert 50e6 <= up <= 110e6 and 50e6 <= down <= 110e6
    assert latency >= 2e-3


def test_another_machines_inventory_is_planned_without_this_machines_devices() -> None:
    """The shipped inventory (a 2-core EPYC and an RPC device behind 100 MB/s, both measured)
    gives a time for a built-in profile with the native module made unloadable: nothing of
    this machine is asked."""
    code = textwrap.dedent("""
        import sys
        sys.modules["sdplan._ggml"] = None  # importing the native module now fails
        from sdplan.core.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    args = ["plan", "--devices", str(EXAMPLE), "--model-profile", "sd15-f16", "--backend", "te=CPU,diffusion=RPC0,vae=CPU",
            "-W", "512", "-H", "512", "--steps", "20", "--json"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    t = json.loads(done.stdout)["time"]
    assert t["profiles"] == {"CPU": "measured", "RPC0": "measured"}
    assert not any("no measured profile" in n for n in t["notes"])
    assert any("work by formula" in n for n in t["notes"])  # no model files: the parameter formula
    assert t["step_s"] > 0 and t["image_s"] > t["step_s"] * 20
    # the diffusion model's weights cross the 100 MB/s link once, at load
    assert t["load_s"] > 1.5e9 / 110e6


def test_another_machines_devices_price_the_work_counted_on_stand_ins() -> None:
    """With model files, the work is counted on CPU backends standing in for the file's
    devices (the RPC device's graphs are counted as its own), priced by each device's
    profile (its op classes where this CPU's kernels are not its own)."""
    pytest.importorskip("sdplan._ggml")
    demo = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
    done = subprocess.run(sdplan_cmd("plan", "--devices", str(EXAMPLE), "-m", str(demo), "--backend",
                                     "te=CPU,diffusion=RPC0,vae=CPU", "-W", "128", "-H", "128", "--json"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    t = json.loads(done.stdout)["time"]
    assert {m: v[0]["source"] for m, v in t["modules"].items()} == {"te": "counted", "diffusion": "counted",
                                                                    "vae": "counted"}
    assert set(t["modules"]["diffusion"][0]["call_s"]) == {"RPC0", "io", "copies"}
    assert t["modules"]["diffusion"][0]["call_s"]["io"] > 2e-3  # a read-back crosses the 1 ms link twice


def test_small_memory_bound_timings_outweigh_a_round_trip() -> None:
    """A device whose compute is waited for over a round trip (an RPC server) times longer
    chains of small memory-bound ops, so the trip's jitter is not taken for their work: 16
    on a CPU, 16 per 20 us of the trip, at most 128; the calibration's convolutions and
    attention reach down to the demo UNet's small levels (a rate is held flat below the
    smallest size measured)."""
    assert [calibrate._mem_chain(s) for s in (0.0, 1e-5, 6e-5, 1.2e-4, 2e-3)] == [16, 16, 48, 96, 128]
    conv_flop = [2.0 * b * c * p * p * c * 9 for b, c, p in calibrate.CONVS if c == 64]
    assert min(conv_flop) == 2.0 * 2 * 64 * 8 * 8 * 64 * 9  # the demo's 8x8 level
    attn_flop = [2.0 * b * h * n * n * 2 * d for b, h, n, d in calibrate.ATTENTIONS if d == 8]
    assert min(attn_flop) == 2.0 * 2 * 8 * 64 * 64 * 2 * 8


def test_calibrate_threads_are_capped_at_the_usable_cpus(monkeypatch, capsys, cache) -> None:
    """``devices --calibrate -t 999`` measures with the CPUs this process may use, as generate
    runs (999 busy-waiting threads on 2 cores ran for minutes and kept a profile "with 999
    threads"), and says so on stderr; a count within them is kept as given."""
    from sdplan.core import cli
    from sdplan.core.commands import devices
    from sdplan.core.runtime import threads

    seen: list[int] = []
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(devices, "_calibrate", lambda inv, n, drives, quiet: seen.append(n) or inv)
    assert cli.main(["devices", "--calibrate", "-t", "999", "--json"]) == 0
    assert cli.main(["devices", "--calibrate", "-t", "1", "--json"]) == 0
    assert seen == [2, 1]
    err = capsys.readouterr().err
    assert err.count("note: -t 999 is capped at the 2 CPUs this process may use") == 1, err


def test_a_drive_without_calibrate_is_refused_not_ignored(tmp_path, capsys, cache) -> None:
    """``devices --drive FOLDER`` measures nothing without ``--calibrate``: one line saying so,
    exit code 2 (it was ignored in silence)."""
    from sdplan.core import cli

    assert cli.main(["devices", "--drive", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --drive {str(tmp_path)!r}: a drive is measured with --calibrate; add it"]
