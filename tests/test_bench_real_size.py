"""The real-size benchmark's inputs: every family the engine runs has a recipe of files in
the released layouts (or says why not), each recipe's files are read back as that family with
the real tensor counts, random files hold the values the writer promises, and sd-cli's log
lines are read into the benchmark's figures (bench/bench_real_size.py,
bench/real_size_files.py)."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.families.registry import FAMILIES
from sdplan.core.modelfiles.checkpoint import read_model_files

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bench_real_size as brs  # noqa: E402
import real_size_files as rsf  # noqa: E402


def test_every_running_family_has_a_recipe_or_a_reason() -> None:
    running = {f.name for f in FAMILIES if f.runs}
    assert running <= set(rsf.RECIPES), running - set(rsf.RECIPES)
    for fam, recipe in rsf.RECIPES.items():
        assert fam in running, fam
        if isinstance(recipe, str):
            assert "../shared/models" in recipe  # the reason names what is missing
        else:
            assert recipe and all(mf.flag.startswith("--") for mf in recipe)


@pytest.mark.parametrize("fam", [f for f, r in rsf.RECIPES.items() if not isinstance(r, str)])
def test_recipe_files_read_as_their_family(fam: str, tmp_path: Path, shared_dir: Path) -> None:
    lay = rsf.layouts(shared_dir)
    recipe = rsf.RECIPES[fam]
    assert not isinstance(recipe, str)
    flags = {}
    total = 0
    for mf in recipe:
        path = tmp_path / mf.name
        total += rsf.write_sparse_header(path, mf, lay)
        flags[mf.flag.lstrip("-").replace("-", "_")] = [str(path)]
        n_layout = sum(len(lay[p.key]) for p in mf.parts)
        with open(path, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(hlen))
        assert len(header) == n_layout  # every real tensor, none added or lost to a prefix clash
    ms = read_model_files(flags)
    assert ms.architecture.family == fam
    assert total > 10**9  # real size: gigabytes of weights


def test_write_random_values(tmp_path: Path) -> None:
    lay = {"k": {"a.weight": [64, 48], "a.norm.weight": [48], "a.bias": [64],
                 "embeddings.position_ids": [1, 77], "conv.weight": [8, 4, 3, 3]}}
    for dtype, np_dt in (("F16", np.float16), ("F32", np.float32)):
        mf = rsf.ModelFile("--model", "m.safetensors", (rsf.FilePart("k", "p."),), dtype)
        path = tmp_path / f"m_{dtype}.safetensors"
        size = rsf.write_random(path, mf, lay, pool_values=4096)
        raw = path.read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + hlen])
        data = raw[8 + hlen:]
        assert len(data) == size and hlen % 8 == 0

        def arr(name: str, header: dict = header, data: bytes = data) -> np.ndarray:
            h = header["p." + name]
            dt = {"F16": np.float16, "F32": np.float32, "I64": np.int64}[h["dtype"]]
            a, b = h["data_offsets"]
            return np.frombuffer(data[a:b], dt).reshape(h["shape"])

        w = arr("a.weight").astype(np.float32)
        assert header["p.a.weight"]["dtype"] == dtype and w.dtype == np.float32
        assert 0.012 < float(w.std()) < 0.028 and abs(float(w.mean())) < 0.005
        assert np.all(arr("a.norm.weight") == 1.0) and np.all(arr("a.bias") == 0.0)
        assert arr("a.norm.weight").dtype == np.float32  # vectors are f32 in every file here
        np.testing.assert_array_equal(arr("embeddings.position_ids"), np.arange(77).reshape(1, 77))
        assert arr("conv.weight").shape == (8, 4, 3, 3) and arr("conv.weight").dtype == np_dt
    # bf16: the top half of the f32 pattern, so its values are f32 values truncated
    mf = rsf.ModelFile("--model", "b.safetensors", (rsf.FilePart("k"),), "BF16")
    path = tmp_path / "b.safetensors"
    rsf.write_random(path, mf, lay, pool_values=4096)
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + hlen])["a.weight"]
    a, b = h["data_offsets"]
    bits = np.frombuffer(raw[8 + hlen + a:8 + hlen + b], np.uint16).astype(np.uint32) << 16
    vals = bits.view(np.float32)
    assert h["dtype"] == "BF16" and math.isclose(float(vals.std()), 0.02, rel_tol=0.3)


def test_sdcli_log_lines_are_read(tmp_path: Path) -> None:
    """Each module's ``loading tensors`` (inside the phase that completes next, as sd-cli loads
    a module's tensors before its first compute) is taken out of that phase and summed in load."""
    log = tmp_path / "sdcli.log"
    log.write_text("[INFO ] loading tensors completed, taking 1.25s (read: 1.00s, memcpy: 0.00s)\n"
                   "[INFO ] get_learned_condition completed, taking 3.50s\n"
                   "[INFO ] loading tensors completed, taking 7.25s (read: 7.19s)\n"
                   "[INFO ] sampling completed, taking 40.00s\n"
                   "[INFO ] loading tensors completed, taking 0.50s (read: 0.25s)\n"
                   "[INFO ] decode_first_stage completed, taking 5.50s\n")
    got = brs.sdcli_phases(log.read_text())
    assert got == {"load": 9.0, "text": 2.25, "sampling": 32.75, "decode": 5.0}


def test_sdplan_parts_split_the_runs() -> None:
    res = {"whole": 10.0, "peak_rss": 3 << 30,
           "runs": {"te": 0.5, "clip_g": 0.25, "diffusion": 8.0, "vae": 1.0, "@load": 0.2}}
    got = brs.sdplan_parts(res, steps=4)
    assert got == {"text": 0.75, "step": 2.0, "decode": 1.0, "load": 0.2, "whole": 10.0, "peak_rss": 3 << 30}
    # a runner's loads came inside its runs: out of its phase, into load only
    res["runs"].update({"@load": 2.75, "@load:te": 0.25, "@load:diffusion": 2.0, "@load:vae": 0.5})
    got = brs.sdplan_parts(res, steps=4)
    assert got == {"text": 0.5, "step": 1.5, "decode": 0.5, "load": 2.75, "whole": 10.0, "peak_rss": 3 << 30}


def test_loads_outside_a_run_are_not_taken_out_of_it(monkeypatch) -> None:
    """A runner's weights loaded when a pipeline enters its session before the runs (SD3's
    conditioner) count in load alone; a load inside its own run is taken out of that run."""
    clock = [0.0]
    monkeypatch.setattr(brs.time, "perf_counter", lambda: clock[0])

    class Runner:
        def __init__(self, name: str) -> None:
            self.name = name

        def _load(self, seconds: float) -> None:
            clock[0] += seconds

        def run(self, inputs: dict) -> None:
            if inputs.get("cold"):
                self._load(2.0)
            clock[0] += inputs["compute"]

    acc, calls, each = brs.time_runners(Runner)
    t5 = Runner("t5xxl")
    t5._load(3.0)                            # the session entered before the runs
    t5.run({"compute": 1.5})
    t5.run({"compute": 1.5})
    vae = Runner("vae")
    vae.run({"compute": 0.5, "cold": True})  # run-scoped weights, loaded in the run
    assert acc == {"@load": 5.0, "t5xxl": 3.0, "@load:vae": 2.0, "vae": 2.5}
    assert calls == {"t5xxl": 2, "vae": 1}
    assert each == {"t5xxl": [1.5, 1.5], "vae": [0.5]}  # each call's compute, its own load out
    got = brs.sdplan_parts({"whole": 10.0, "peak_rss": 1, "runs": acc}, steps=1)
    assert (got["text"], got["decode"], got["load"]) == (3.0, 0.5, 5.0)


def test_the_step_is_the_median_after_the_first_with_two_steps_or_more() -> None:
    """As diffusers' step is timed after a warm-up call, sdplan's is the median of its steps
    after the first (the calls grouped per step: two per step when CFG runs as two calls);
    the first step is kept beside it. With one step, that step."""
    res = {"whole": 30.0, "peak_rss": 1, "runs": {"diffusion": 17.0, "@load": 1.0},
           "each": {"diffusion": [4.0, 3.0, 2.5, 2.5, 2.0, 3.0]}}
    got = brs.sdplan_parts(res, steps=3)
    assert (got["first_step"], got["step"]) == (7.0, 5.0)
    got = brs.sdplan_parts({**res, "each": {"diffusion": [6.0]}, "runs": {"diffusion": 6.0}}, steps=1)
    assert got["step"] == 6.0 and "first_step" not in got


def test_dropping_the_whole_page_cache_needs_a_writable_drop_caches(monkeypatch, shared_dir: Path,
                                                                    tmp_path: Path) -> None:
    """``--page-cache all`` is refused in one line where /proc/sys/vm/drop_caches cannot be
    written (not root), before any file is written; where it can, the flags pass."""
    import argparse

    fam = next(f for f, r in rsf.RECIPES.items() if not isinstance(r, str))
    a = argparse.Namespace(families=fam, parts="sdplan", threads=2, rounds=1, steps=None, size=None,
                           shared=str(shared_dir), quant="", sdcli="", json=None, page_cache="all")
    monkeypatch.setattr(brs, "DROP_CACHES", str(tmp_path / "missing" / "drop_caches"))
    with pytest.raises(SystemExit, match=r"--page-cache all: .* is not writable here \(it needs root\)"):
        brs.check_flags(a)
    writable = tmp_path / "drop_caches"
    writable.write_text("0\n")
    monkeypatch.setattr(brs, "DROP_CACHES", str(writable))
    brs.check_flags(a)


def test_an_sdcli_killed_in_its_decode_keeps_the_phases_it_finished(tmp_path: Path, capsys) -> None:
    """sd-cli killed by the kernel in its decode (out of memory): its text and step stay in the
    row, its decode and whole time are not measured, and the script goes on."""
    fake = tmp_path / "sd-cli"
    fake.write_text("#!/bin/sh\necho '[INFO ] loading tensors completed, taking 1.00s (read: 1.00s)'\n"
                    "echo '[INFO ] get_learned_condition completed, taking 3.00s'\n"
                    "echo '[INFO ] sampling completed, taking 40.00s'\nkill -9 $$\n")
    fake.chmod(0o755)
    got = brs.run_sdcli(str(fake), [], 2, tmp_path / "sdcli.log")
    assert (got["text"], got["step"]) == (2.0, 20.0) and math.isnan(got["decode"]) and math.isnan(got["whole"])
    assert "sd-cli killed (SIGKILL: out of memory?)" in capsys.readouterr().err


def test_diffusers_reference_dits_are_the_whole_released_models(shared_dir: Path) -> None:
    """The DiT families' diffusers references take bench_dit_blocks' configurations with every
    block of the real layout (SD3-medium 24 joint blocks, FLUX.2 klein 4B 5 double and 20
    single), and each reference family has a recipe of files."""
    import argparse

    a = argparse.Namespace(shared=str(shared_dir))
    cls, cfg = brs.ref_dit(a, "sd3")
    assert cls == "SD3Transformer2DModel" and cfg["num_layers"] == 24 and cfg["joint_attention_dim"] == 4096
    cls, cfg = brs.ref_dit(a, "flux2_klein")
    assert cls == "Flux2Transformer2DModel"
    assert (cfg["num_layers"], cfg["num_single_layers"], cfg["joint_attention_dim"]) == (5, 20, 7680)
    assert brs.ref_dit(a, "sdxl") is None
    assert all(not isinstance(rsf.RECIPES[f], str) for f in brs.REF_FAMILIES)


def test_the_prediction_row_is_what_plan_says_of_the_same_flags() -> None:
    """The table's ``predicted`` row asks ``sdplan plan --json`` with generate's flags (files,
    size, steps, CFG, sampler, threads) and keeps its time: the demo's figures are positive,
    the picture is load + text + steps x step + decode, and a missing file is an error."""
    repo = BENCH.parent
    demo = repo / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
    argv = brs.gen_args({"--model": demo}, 128, 4, 5.0, "euler", 1, Path("/tmp/unused.png"), "")
    got = brs.predicted(argv, 1)
    assert all(got[k] > 0 for k in ("text", "step", "decode", "load", "whole"))
    # CFG 5 prices the negative prompt's encode too; the picture sums the phases
    assert got["whole"] == pytest.approx(got["load"] + got["text"] + 4 * got["step"] + got["decode"], rel=0.05)
    one = brs.predicted(brs.gen_args({"--model": demo}, 128, 8, 5.0, "euler", 1, Path("/tmp/unused.png"), ""), 1)
    assert one["step"] == pytest.approx(got["step"]) and one["whole"] > got["whole"]
    with pytest.raises(RuntimeError, match="no time prediction"):
        brs.predicted(brs.gen_args({"--model": repo / "missing.safetensors"}, 128, 4, 5.0, "euler", 1,
                                   Path("/tmp/unused.png"), ""), 1)


@pytest.mark.parametrize(("flags", "line"), [
    ({"families": "bogus"}, "--families 'bogus': no recipe for ['bogus']"),
    ({"families": ""}, "--families '': no recipe for an empty list"),
    ({"parts": "sdplan,bogus"}, "--parts 'sdplan,bogus': unknown ['bogus']"),
    ({"threads": 0}, "--threads must be at least 1, got 0"),
    ({"rounds": 0}, "--rounds must be at least 1, got 0"),
    ({"steps": 0}, "--steps must be at least 1, got 0"),
    ({"size": -8}, "--size must be at least 1, got -8"),
    ({"shared": "/nonexistent"}, "--shared '/nonexistent': no models/real_size_key_layouts.json in it"),
    ({"quant": "q8_0,q3_k", "sdcli": "/usr/bin/sd-cli"}, "--quant 'q8_0,q3_k': choose from q8_0, q4_k, q5_k"),
    ({"quant": ","}, "--quant ',': choose from q8_0, q4_k, q5_k"),
    ({"quant": "q8_0"}, "--quant 'q8_0' needs --sdcli or SDCLI"),
    ({"json": "/nonexistent/rows.json"}, "--json '/nonexistent/rows.json': no folder '/nonexistent'"),
])
def test_bad_flags_are_refused_before_any_file_is_written(flags: dict, line: str, shared_dir: Path) -> None:
    """An unknown family printed "not run" and an empty table with exit 0, an unknown part ran
    nothing of it, ``--steps 0``/``--size 0`` ran the family's defaults, a ``--shared`` without
    the layouts ended in a traceback, ``--quant`` without sd-cli was refused only after the first
    family's files were written, and a ``--json`` in a missing folder lost the rows at the end:
    each is one line before any work."""
    import argparse

    fam = next(f for f, r in rsf.RECIPES.items() if not isinstance(r, str))
    base = {"families": fam, "parts": "sdplan,sdcli,diffusers", "threads": 2, "rounds": 1,
            "steps": None, "size": None, "shared": str(shared_dir), "quant": "", "sdcli": "", "json": None}
    with pytest.raises(SystemExit) as exc:
        brs.check_flags(argparse.Namespace(**{**base, **flags}))
    assert str(exc.value).startswith(line), exc.value
    brs.check_flags(argparse.Namespace(**base))  # the defaults pass
