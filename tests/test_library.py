"""The model library: a folder of sparse real-layout files (``../shared/models``) and the
test fixtures is listed with each file's kind and family; the header cache makes a second
scan read nothing; each diffusion model's fit verdict is what ``sdplan plan`` says for the
same files and flags, on three device inventories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.modelfiles import library as lib
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.modelfiles.library import LibraryCache, describe_file, scan_library
from sdplan.core.modelfiles.library_fit import combined_profile, companions, fit_verdict
from sdplan.core.planning.inventory import Device, Inventory
from sparse_writer import make_library_folder, write_sparse

GIB = 1 << 30
INVENTORIES = {
    "one 24 GiB GPU": Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 23 * GIB, 24 * GIB),
                                 Device("CPU", "Ryzen 9", "cpu", "CPU", 48 * GIB, 64 * GIB))),
    "two 12 GiB GPUs": Inventory((
        Device("CUDA0", "RTX 3060", "gpu", "CUDA", int(11.5 * GIB), 12 * GIB),
        Device("CUDA1", "RTX 3060", "gpu", "CUDA", int(11.5 * GIB), 12 * GIB),
        Device("CPU", "Ryzen 9", "cpu", "CPU", 8 * GIB, 16 * GIB))),
    "a 6 GiB GPU": Inventory((Device("CUDA0", "GTX 1060", "gpu", "CUDA", 5 * GIB, 6 * GIB),
                              Device("CPU", "i5", "cpu", "CPU", 4 * GIB, 8 * GIB))),
}


@pytest.fixture(scope="module")
def folder(shared_dir: Path, tmp_path_factory) -> tuple[Path, dict[str, tuple]]:
    layouts = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    root = tmp_path_factory.mktemp("library")
    return root, make_library_folder(root, layouts, shared_dir)


@pytest.fixture
def cache(tmp_path: Path) -> LibraryCache:
    return LibraryCache(tmp_path / "cache.json")


class ReadCounter:
    """Counts header reads by the library (every path to a header goes through these)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        for name in ("read_tensor_file", "read_model_files"):
            real = getattr(lib, name)
            monkeypatch.setattr(lib, name, self._wrap(real))

    def _wrap(self, real):  # noqa: ANN001, ANN202
        def counted(arg):  # noqa: ANN001, ANN202
            self.paths.append(str(arg))
            return real(arg)
        return counted


def expected_of(path: str, want: tuple | None) -> tuple:
    """The expected (kind, family, encoders, latent channels); for the families other parts
    detect (``None`` family of a diffusion layout), what ``read_model_files`` says."""
    kind, family, encoders, latent = want
    if kind == "diffusion" and family is None:
        ms = read_model_files({"model": [path]})
        mods = ms.modules()
        if mods == ["diffusion"]:
            return ("diffusion", ms.architecture.family, (), None)
        if mods == ["te"]:
            return ("encoder", None, tuple(ms.encoder_bytes()), None)
    return kind, family, encoders, latent


def test_each_file_is_listed_with_its_kind_and_family(folder, cache) -> None:
    root, expected = folder
    result = scan_library([root], cache)
    got = {e.path: e for e in result.entries}
    assert set(got) == set(expected)
    for path, want in expected.items():
        e = got[path]
        assert (e.kind, e.family, e.encoders, e.latent_channels) == expected_of(path, want), path
    by_name = {e.name: e for e in result.entries}
    flux = by_name["flux1-dev.safetensors"]
    assert (flux.architecture, flux.quant, flux.group) == ("flux-dev", "BF16", "flux")
    assert flux.size == os.path.getsize(flux.path) and flux.weight_bytes > 23 * 10**9
    assert by_name["sd3_medium.safetensors"].architecture == "sd3-medium"
    assert by_name["t5xxl_fp16.safetensors"].quant == "F16"
    assert by_name["sd1_ref.safetensors"].error.startswith("not a model")
    assert list(lib.grouped(result.entries))[:5] == ["flux", "flux2_klein", "sd1", "sd3", "sdxl"]


def test_a_second_scan_reads_no_header(folder, cache, monkeypatch) -> None:
    root, expected = folder
    counter = ReadCounter(monkeypatch)
    first = scan_library([root], cache)
    assert first.headers_read == len(counter.paths) == len(expected)
    assert first.cached == 0
    counter.paths.clear()
    again = scan_library([root], LibraryCache(cache.path))  # as a new process would
    assert again.headers_read == 0 and counter.paths == []
    assert again.cached == len(expected)
    assert [e.to_json() for e in again.entries] == [e.to_json() for e in first.entries]
    # a changed file (new modification time) is read again, alone
    vae = next(p for p in expected if p.endswith("sd_vae.safetensors"))
    st = os.stat(vae)
    os.utime(vae, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = scan_library([root], LibraryCache(cache.path))
    assert third.headers_read == 1 and counter.paths == [vae]


def test_a_broken_cache_or_one_of_other_code_is_an_empty_one(folder, tmp_path) -> None:
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    result = scan_library([folder[0]], LibraryCache(path))
    assert result.cached == 0 and result.headers_read == len(folder[1])
    data = json.loads(path.read_text())
    assert data["entries"] and data["stamp"] == lib.classifier_stamp()  # rewritten
    data["stamp"] = "older code"  # another sdplan's cache: its descriptions may differ
    path.write_text(json.dumps(data))
    assert scan_library([folder[0]], LibraryCache(path)).cached == 0


def test_pickles_are_listed_unread_and_deleted_files_leave_the_cache(tmp_path, cache) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old.ckpt").write_bytes(b"PK\x03\x04" + b"\0" * 60)
    write_sparse(tmp_path / "m" / "vae.safetensors", {"decoder.conv_in.weight": [512, 4, 3, 3]},
                 "F16")
    result = scan_library([tmp_path / "m"], cache)
    kinds = {e.name: e.kind for e in result.entries}
    assert kinds == {"old.ckpt": "pickle", "vae.safetensors": "vae"}
    assert result.headers_read == 1
    (tmp_path / "m" / "vae.safetensors").unlink()
    scan_library([tmp_path / "m"], cache)
    assert [Path(p).name for p in LibraryCache(cache.path).entries] == ["old.ckpt"]


def test_companions_and_their_profile_match_reading_the_files_together(folder, cache) -> None:
    root, _ = folder
    entries = scan_library([root], cache).entries
    by_name = {e.name: e for e in entries}
    files, missing = companions(by_name["flux1-dev.safetensors"], entries)
    names = {k: [Path(p).name for p in v] for k, v in files.items()}
    assert names == {"diffusion_model": ["flux1-dev.safetensors"],
                     "clip_l": ["clip_l.safetensors"], "t5xxl": ["t5xxl_fp16.safetensors"],
                     "vae": ["ae.safetensors"]}  # the full-size files beside it, not the tiny
    assert missing == ()
    parts = [by_name[Path(p).name] for v in files.values() for p in v]
    assert combined_profile(parts) == read_model_files(files).profile()
    tiny, _ = companions(by_name["flux_dev_tiny.safetensors"], entries)
    assert Path(tiny["t5xxl"][0]).name == "t5_tiny.safetensors"  # its own folder's
    sd3, missing = companions(by_name["sd3_medium.safetensors"], entries)
    assert missing == ("clip_g",) and "clip_l" in sd3 and "t5xxl" in sd3
    zi, missing = companions(by_name["z_image_turbo_bf16.safetensors"], entries)
    assert {k: Path(v[0]).name for k, v in zi.items()} == {
        "diffusion_model": "z_image_turbo_bf16.safetensors", "llm": "qwen_3_4b.safetensors",
        "vae": "ae.safetensors"} and missing == ()
    zi_parts = [by_name[Path(p).name] for v in zi.values() for p in v]
    assert combined_profile(zi_parts) == read_model_files(zi).profile()
    assert companions(by_name["v1-5-pruned-emaonly.safetensors"], entries) == (
        {"model": [by_name["v1-5-pruned-emaonly.safetensors"].path]}, ())


def _plan_json(capsys, files: dict[str, list[str]], fit: dict, devices: Path) -> dict:
    args = ["plan", "--json", "--devices", str(devices)]
    for key, paths in files.items():
        for p in paths:
            args += [{"model": "--model", "diffusion_model": "--diffusion-model"}.get(
                key, f"--{key}"), p]
    for flag in ("backend", "params_backend", "max_vram"):
        if fit[flag]:
            args += [f"--{flag.replace('_', '-')}", fit[flag]]
    args += ["-W", str(fit["width"]), "-H", str(fit["height"])]
    assert cli.main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("inv_name", list(INVENTORIES))
def test_fit_verdicts_equal_sdplan_plan(folder, tmp_path, capsys, inv_name) -> None:
    root, _ = folder
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps(INVENTORIES[inv_name].to_json()))
    argv = ["library", str(root), "--json", "--devices", str(devices),
            "--cache", str(tmp_path / "c.json")]
    assert cli.main(argv) == 0
    listed = json.loads(capsys.readouterr().out)
    judged = [f for f in listed["files"] if f["fit"] is not None]
    assert {f["name"] for f in judged} == {
        f["name"] for f in listed["files"] if f["kind"] in ("checkpoint", "diffusion")}
    verdicts = {}
    for f in judged:
        fit = f["fit"]
        plan = _plan_json(capsys, fit["files"], fit, devices)
        assert plan["fit"]["fits"] == fit["fits"] == (fit["verdict"] != "none"), f["name"]
        mods = [plan["modules"][m] for m in plan["fit"]["modules"]]
        offload = any(m["params"]["mode"] != "runtime" for m in mods)
        split = any(len(m["devices"]) > 1 for m in mods)
        if fit["fits"]:  # the category is what the plan does
            assert fit["verdict"] == ("offload" if offload else "split" if split
                                      else "resident"), f["name"]
        verdicts[f["name"]] = fit["verdict"]
    # what each machine can do (the estimate's figures, see docs in library_fit)
    assert verdicts["v1-5-pruned-emaonly.safetensors"] == "resident"
    assert verdicts["sdplan-demo-shapes.safetensors"] == "resident"
    expect_flux = {"one 24 GiB GPU": "offload", "two 12 GiB GPUs": "offload",
                   "a 6 GiB GPU": "offload"}[inv_name]
    assert verdicts["flux1-dev.safetensors"] == expect_flux
    # a 6 GiB card: the UNet streamed from disk in --max-vram segments (its stages)
    expect_xl = {"one 24 GiB GPU": "resident", "two 12 GiB GPUs": "resident",
                 "a 6 GiB GPU": "offload"}[inv_name]
    assert verdicts["sd_xl_base_1.0.safetensors"] == expect_xl


def test_the_verdict_of_one_model_in_python(folder, cache) -> None:
    root, _ = folder
    entries = scan_library([root], cache).entries
    flux = next(e for e in entries if e.name == "flux1-dev.safetensors")
    v = fit_verdict(flux, entries, INVENTORIES["one 24 GiB GPU"])
    assert v.verdict == "offload" and v.fits and (v.width, v.height) == (1024, 1024)
    assert "diffusion=CPU" in v.params_backend
    assert v.summary().startswith("fits with offload at 1024x1024: --backend CUDA0")
    with pytest.raises(ValueError, match="not a diffusion model"):
        fit_verdict(next(e for e in entries if e.kind == "vae"), entries,
                    INVENTORIES["a 6 GiB GPU"])


def test_cli_table_and_errors(folder, tmp_path, capsys) -> None:
    root, _ = folder
    devices = tmp_path / "d.json"
    devices.write_text(json.dumps(INVENTORIES["a 6 GiB GPU"].to_json()))
    assert cli.main(["library", str(root), "--devices", str(devices),
                     "--cache", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "flux1-dev.safetensors" in out and "fits with offload" in out
    assert "does not fit" in out  # SDXL on 6 GiB
    assert f"{len(folder[1])} files: {len(folder[1])} headers read, 0 from the cache" in out
    assert cli.main(["library", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_describe_file_of_a_lora_and_a_broken_file(tmp_path) -> None:
    peft = {f"transformer.single_transformer_blocks.{i}.attn.to_k.lora_A.weight": [4, 3072]
            for i in range(2)}
    write_sparse(tmp_path / "peft.safetensors", peft, "BF16")
    e, reads = describe_file(tmp_path / "peft.safetensors")
    assert (e.kind, e.family, reads) == ("lora", "flux", 1)
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 8)
    e, reads = describe_file(tmp_path / "bad.safetensors")
    assert e.kind == "unknown" and e.error and reads == 1


def test_a_verdict_says_how_long_a_picture_takes(folder, cache) -> None:
    from dataclasses import replace

    from sdplan.core.planning.device_profile import DeviceProfile, Link
    from sdplan.core.planning.timing import RunSettings

    root, _ = folder
    entries = scan_library([root], cache).entries
    fast = DeviceProfile({"mm:f16": ((1.0, 5e13),)}, mem_bps=8e11, node_s=5e-6, graph_s=1e-4,
                         h2d=Link(2e10, 1e-5), d2h=Link(2e10, 1e-5))
    plain = INVENTORIES["one 24 GiB GPU"]
    measured = Inventory((replace(plain.devices[0], profile=fast), plain.devices[1]))
    sd15 = next(e for e in entries if e.name == "v1-5-pruned-emaonly.safetensors")
    v = fit_verdict(sd15, entries, measured)
    assert v.verdict == "resident" and v.backend == "CUDA0" and v.time is not None
    # SD 1's defaults (20 steps of euler_a, CFG 7) at 512 px; the UNet by the formula of
    # timing's docstring: 2 * params (f16) * 64 * 64 latent px * 0.1141 * 2 (CFG) FLOP at
    # 50 TFLOP/s, plus the graph's 1e-4 s and the input and output latency (1e-5 s each)
    assert (v.time["steps"], v.time["sampler"], v.time["cfg"], v.time["measured"]) == (20, "euler_a", True, True)
    params = combined_profile([sd15] + [e for e in entries if e.path in
                                        [p for k, ps in v.files.items() if k != "model" for p in ps]]
                              ).get("diffusion").total / 2  # type: ignore[union-attr]
    step = 2 * params * 64 * 64 * 0.1141 * 2 / 5e13 + 1e-4 + 2e-5
    assert v.time["step_s"] == pytest.approx(step)
    assert v.time["image_s"] > 20 * step and v.time["load_s"] > 0
    assert v.to_json()["time"] == v.time
    assert "~" in v.time_text() and not v.time_text().endswith("*")
    assert v.summary().endswith(f"{v.time_text(long=True)}") and "20 steps" in v.summary()
    # the same plan without a measured profile: the stated defaults, flagged
    d = fit_verdict(sd15, entries, plain)
    assert d.time is not None and d.time["measured"] is False and d.time_text().endswith("*")
    assert "default speeds" in d.time_text(long=True)
    # FLUX.1 dev: its family's 20 steps of euler without CFG; a plan that does not fit has no time
    flux = fit_verdict(next(e for e in entries if e.name == "flux1-dev.safetensors"), entries, measured)
    assert flux.time is not None and (flux.time["steps"], flux.time["sampler"], flux.time["cfg"]) == (20, "euler", False)
    xl = fit_verdict(next(e for e in entries if e.name == "sd_xl_base_1.0.safetensors"), entries,
                     INVENTORIES["a 6 GiB GPU"], width=4096, height=4096)
    assert xl.verdict == "none" and xl.time is None and xl.time_text() == ""
    assert RunSettings().steps == 20


def test_the_cli_lists_the_time_and_marks_default_speeds(folder, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-profiles"))  # none measured here
    root, _ = folder
    devices = tmp_path / "d.json"
    devices.write_text(json.dumps(INVENTORIES["one 24 GiB GPU"].to_json()))
    assert cli.main(["library", str(root), "--devices", str(devices), "--json",
                     "--cache", str(tmp_path / "c.json")]) == 0
    listed = {f["name"]: f["fit"] for f in json.loads(capsys.readouterr().out)["files"] if f["fit"]}
    t = listed["v1-5-pruned-emaonly.safetensors"]["time"]
    assert t["measured"] is False and t["steps"] == 20 and t["image_s"] > 20 * t["step_s"] > 0
    assert cli.main(["library", str(root), "--devices", str(devices), "--cache", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "s/picture*" in out and "* default speeds (sdplan devices --calibrate" in out
