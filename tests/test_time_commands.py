"""The predicted time on the command line: ``sdplan plan``'s table and ``"time"`` JSON,
``generate -v``'s predicted beside measured, and each picture's measured timings."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import REPO
from rpc_util import sdplan_cmd
from sdplan.core.commands.time_estimate import measured_timings

DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"


def test_measured_timings_take_the_median_step_after_the_first() -> None:
    # the first interval is 0 (no step before it), the second includes building the graph
    assert measured_timings([0.0, 0.9, 0.2, 0.4, 0.3], {"total": 2.5}) == {"step_s": 0.35, "image_s": 2.5}
    assert measured_timings([0.0], {"per_step": 0.7, "total": 1.0}) == {"step_s": 0.7, "image_s": 1.0}
    assert measured_timings([], {}) == {}


def test_plan_prints_and_writes_the_time_of_the_demo(tmp_path) -> None:
    pytest.importorskip("sdplan._ggml")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}  # no measured profile here: defaults
    args = ["plan", "-m", str(DEMO), "-W", "128", "-H", "128", "--steps", "10", "--sampling-method", "heun"]
    done = subprocess.run(sdplan_cmd(*args, "--json"), capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    t = json.loads(done.stdout)["time"]
    assert (t["steps"], t["sampler"], t["cfg"]) == (10, "heun", True)
    assert {m: [x["source"] for x in v] for m, v in t["modules"].items()} == {
        "te": ["counted"], "diffusion": ["counted"], "vae": ["counted"]}
    assert t["modules"]["diffusion"][0]["calls"] == 2  # heun evaluates twice per step
    assert t["sampling_s"] == pytest.approx(10 * t["step_s"])
    assert t["image_s"] == pytest.approx(t["load_s"] + t["text_s"] + t["sampling_s"] + t["decode_s"])
    assert t["profiles"] == {"CPU": "default"} and any("no measured profile" in n for n in t["notes"])
    table = subprocess.run(sdplan_cmd(*args), capture_output=True, text=True, env=env, timeout=300)
    assert "Time estimate (10 steps, heun, CFG, 128x128, batch 1)" in table.stdout
    assert f"Predicted: step {t['step_s']:.3f} s" in table.stdout


@pytest.mark.parametrize(("extra", "line"), [
    (["--steps", "0"], "error [invalid_argument]: --steps must be at least 1, got 0"),
    (["--cfg-scale", "nan"], "error [invalid_argument]: --cfg-scale must be a finite number, got nan"),
    (["--sampling-method", "bogus"], "error [invalid_argument]: --sampling-method 'bogus' is unknown; choose one of "),
    (["--sampling-method", ""], "error [invalid_argument]: --sampling-method '' is unknown; choose one of "),
])
def test_plan_refuses_time_flags_generate_refuses(extra, line, capsys) -> None:
    """``plan --steps 0`` was predicted as 20 steps, an unknown sampler or a NaN CFG scale
    printed a prediction, an empty sampler was priced as the family's default: each is now the
    one line ``generate`` gives for it."""
    from sdplan.core.cli import main

    inv = REPO / "resources" / "inventories" / "epyc-2core-rpc-100mbps.json"
    assert main(["plan", "--devices", str(inv), "--model-profile", "sd15-f16", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err


def test_generate_records_measured_timings_and_prints_the_prediction_beside_them(tmp_path) -> None:
    pytest.importorskip("sdplan._ggml")
    from PIL import Image

    out = tmp_path / "demo.png"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(sdplan_cmd("generate", "--demo", "-p", "a red circle on a blue background", "--steps", "4",
                                     "-t", "1", "-v", "-o", str(out)), capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    timings = json.loads(Image.open(out).text["sdplan"])["timings"]
    # the engine's own phases as the picture's record keeps them, and the measured step and picture
    assert {"step_s", "image_s", "total", "sampling"} <= set(timings)
    assert 0 < timings["step_s"] < timings["image_s"] and timings["image_s"] == pytest.approx(timings["total"], abs=1e-4)
    line = next(x for x in done.stderr.splitlines() if x.startswith("Predicted: step"))
    import re

    # the line prints the measured step to 3 decimals, the picture's record keeps it rounded to
    # its own precision: the same figure within one unit of the printed last digit
    printed = float(re.search(r"step [0-9.]+ s \(measured ([0-9.]+) s,", line).group(1))
    assert printed == pytest.approx(timings["step_s"], abs=1.0e-3)
    assert "--verbose: no effect" not in done.stderr  # sd-cli's -v is honoured here


def test_threads_beyond_this_machines_cpus_are_priced_as_generate_runs_them(monkeypatch) -> None:
    """``plan -t 999`` on this machine's devices priced 999 threads (a step of 0.000 s on 2
    cores) where generate caps -t at the CPUs it may use; an inventory file of another machine
    keeps the count as given."""
    import argparse

    from sdplan.core.commands.time_estimate import settings_of
    from sdplan.core.runtime import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])

    def ns(t: int, devices: str | None) -> argparse.Namespace:
        return argparse.Namespace(threads=t, devices=devices, steps=20, cfg_scale=7.0, sampling_method="euler",
                                  width=512, height=512, batch_count=1)

    assert settings_of(ns(999, None)).threads == 2
    assert settings_of(ns(1, None)).threads == 1
    # no -t: generate's default (the CPUs it may use), not the count the profile was measured
    # with (a profile kept from a 1-thread calibration priced a 2-thread run at 2x its time)
    assert settings_of(ns(0, None)).threads == 2
    assert settings_of(ns(999, "other.json")).threads == 999 and settings_of(ns(0, "other.json")).threads == 0


def test_plan_prices_the_familys_defaults_where_steps_cfg_and_sampler_are_not_given(monkeypatch) -> None:
    """Without ``--steps``/``--cfg-scale``/``--sampling-method`` the prediction takes what
    generate takes for the model's family (FLUX.2 klein: 4 steps, CFG 1 so no negative prompt,
    euler), not sd-cli's 20 steps at CFG 7 (which priced klein's text and DiT passes twice);
    an unknown model keeps sd-cli's defaults and given flags win."""
    import argparse

    from sdplan.core.commands.time_estimate import settings_of
    from sdplan.core.runtime import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])

    def ns(**kw: object) -> argparse.Namespace:
        base = {"threads": 0, "devices": None, "steps": None, "cfg_scale": None, "sampling_method": None,
                "width": 1024, "height": 1024, "batch_count": 1}
        return argparse.Namespace(**{**base, **kw})

    s = settings_of(ns(), "flux2_klein")
    assert (s.steps, s.cfg, s.sampler) == (4, False, "euler")
    s = settings_of(ns(), None)
    assert (s.steps, s.cfg, s.sampler) == (20, True, "euler_a")
    s = settings_of(ns(steps=8, cfg_scale=3.5, sampling_method="dpm++2m"), "flux2_klein")
    assert (s.steps, s.cfg, s.sampler) == (8, True, "dpm++2m")


def test_plan_names_why_it_could_not_count_the_graphs_and_refuses_a_size_generate_refuses(tmp_path) -> None:
    """``sdplan plan`` with a FLUX.1 autoencoder given to FLUX.2 klein said only that the family
    had no count; a klein set without its VAE priced no decode in silence; ``-W 100`` planned
    and predicted a size generate refuses. Now the autoencoder is refused in generate's line
    naming --vae and the file (a set generate cannot run is not planned), the notes name the
    file missing, and the size is a one-line error naming -W/-H."""
    from flux2_util import AE, DIT, write_llm
    from sdplan.core.cli import main

    fix = AE.parent
    llm = str(write_llm(tmp_path / "llm.safetensors"))

    def plan(*extra: str) -> tuple[int, str]:
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["plan", "--diffusion-model", str(DIT), "--llm", llm, "-W", "64", "-H", "64", *extra])
        return rc, out.getvalue() + err.getvalue()

    rc, text = plan("--vae", str(fix / "flux_ae_tiny.safetensors"))
    assert rc == 2 and text.splitlines() == [
        f"error [invalid_model_file]: {fix / 'flux_ae_tiny.safetensors'}: --vae: a FLUX.1 or SD3 autoencoder "
        "(16 latent channels); FLUX.2 klein needs the FLUX.2 autoencoder (32 latent channels)"], text
    rc, text = plan()
    assert rc == 0 and "FLUX.2 klein needs" in text and "--vae" in text
    rc, text = plan("--vae", str(AE))
    assert rc == 0 and "work by formula" not in text and "needs" not in text
    assert text.count(f"the drive of {fix} has no measured profile") <= 1  # once per folder
    rc, text = plan("--vae", str(AE), "-t", "999")
    assert rc == 0 and "-t 999: generate runs at most" in text
    rc, text = plan("--vae", str(AE), "-W", "100")
    assert rc != 0 and "-W/-H 100x64" in text and "multiples of 16" in text


def test_plan_reads_each_model_files_header_once(tmp_path, monkeypatch, capsys) -> None:
    """``sdplan plan`` read every model file's header for its profile, again for the dry run's
    family, again for the size check and again for the work count's family; it now reads each
    once and hands the headers to the others. Counted: the calls of the header reader
    (``read_tensor_file``) through the readers module, after a first run has loaded every module
    the command uses (so the engine's graph builders, which open the weights they load
    themselves and hold the function under their own name, are not counted)."""
    pytest.importorskip("sdplan._ggml")
    from collections import Counter

    from flux2_util import AE, DIT, write_llm
    from sdplan.core.cli import main
    from sdplan.core.modelfiles import checkpoint, readers

    llm = write_llm(tmp_path / "llm.safetensors")
    args = ["plan", "--diffusion-model", str(DIT), "--llm", str(llm), "--vae", str(AE), "-W", "64", "-H", "64",
            "--json"]
    assert main(args) == 0
    capsys.readouterr()
    reads: Counter[str] = Counter()
    real = readers.read_tensor_file

    def counting(path):
        reads[str(path)] += 1
        return real(path)

    monkeypatch.setattr(readers, "read_tensor_file", counting)
    monkeypatch.setattr(checkpoint, "read_tensor_file", counting, raising=False)  # its own name, if it had one
    assert main(args) == 0
    t = json.loads(capsys.readouterr().out)["time"]
    assert {m: [x["source"] for x in v] for m, v in t["modules"].items()} == {
        "te": ["counted"], "diffusion": ["counted"], "vae": ["counted"]}
    assert reads == {str(DIT): 1, str(llm): 1, str(AE): 1}
