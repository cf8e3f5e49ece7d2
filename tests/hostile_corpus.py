"""A corpus of hostile inputs for every reader and flag, and the runner that checks each.

:func:`build` writes the hostile files under ``ROOT/inputs`` (JSON documents, model files,
``.pth`` archives, pictures, FIFOs, links) and returns the cases: command lines of
``sdplan`` (``plan``, ``inspect``, ``library``, ``generate``, ``upscale``) and direct calls
of the readers the app uses at start-up (queue, saved session, picture records, library
cache). Outputs go under ``ROOT/out``.

:func:`run_all` runs every case in this process (``generate`` in-process), and checks:

- the exit code is one of the case's (a refusal: 2), the refusal is one line on stderr
  (``error ...`` or ``sdplan COMMAND: ...``) and no traceback is printed;
- no file under ``ROOT/inputs`` (nor the packaged demo model) changed: every file's size,
  modification time and inode after each case, and every file's SHA-256 at the end;
- the process's peak resident memory (:func:`peak_kib`) stays under 1 GiB: a peak is never
  lower after a case, so the final peak bounds every case's.

Run as a script (``python tests/hostile_corpus.py ROOT``) it prints one JSON object with the
results; tests/test_hostile_corpus.py runs it in a child process.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import resource
import struct
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
LORA = REPO / "resources" / "demo" / "loras" / "outline.safetensors"
GIB = 1 << 30
#: Peak resident memory allowed (KiB, as ``ru_maxrss`` counts on Linux).
MAX_RSS_KIB = 1 << 20


@dataclass
class Case:
    """One hostile input: ``argv`` of ``sdplan`` (or ``reader``: a call of a reader on
    ``path``), the exit codes it may end with, and the error text its one line must hold."""

    name: str
    argv: list[str] = field(default_factory=list)
    expect: tuple[int, ...] = (2,)
    needle: str = ""
    reader: str = ""
    path: str = ""


# ----------------------------------------------------------------------------- payloads


def json_payloads() -> dict[str, bytes]:
    """Hostile JSON documents by name (each a few bytes to 17 MiB)."""
    return {
        "deep_array": b"[" * 100_000 + b"]" * 100_000,
        "deep_object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "levels_70": b"[" * 70 + b"]" * 70,
        "oversize": b"{}" + b" " * (17 << 20),
        "many_items": b"[" + b"0," * 4_100_000 + b"0]",
        "many_containers": b"[" + b"[]," * 1_100_000 + b"[]]",
        "nan": b'{"devices": [{"name": "CUDA0", "free": NaN}], "modules": {"d": NaN}}',
        "infinity": b'{"devices": Infinity, "weight_map": -Infinity}',
        "overflow": b'{"devices": [1e999]}',
        "bigint": b'{"devices": [' + b"9" * 5000 + b"]}",
        "not_utf8": b'\xff\xfe{"devices": []}',
        "truncated": b'{"devices": [{"name": "CUDA0",',
        "empty": b"",
        "null": b"null",
        "array": b"[1, 2, 3]",
        "wrong_types": b'{"devices": "x", "modules": 5, "weight_map": 3, "stamp": 1, "jobs": 4}',
        "negative": (b'{"devices": [{"name": "CUDA0", "description": "x", "type": "gpu", '
                     b'"registry": "CUDA", "free": -1, "total": -5}], "modules": {"diffusion": '
                     b'{"blocks": [-1], "other": -2}}}'),
        "long_string": b'{"devices": [{"name": "' + b"x" * 2_000_000 + b'"}]}',
    }


def raw_safetensors(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def gguf(n_tensors: int = 0, n_kv: int = 0, body: bytes = b"", version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + body


def model_payloads() -> dict[str, bytes]:
    """Hostile model files by name: safetensors and GGUF headers, pickles, other formats."""
    j = json.dumps
    ok = _entry("F32", [2, 2], 0, 16)
    return {
        "st_len_beyond": raw_safetensors(b"{}", length=10**12),
        "st_len_huge": raw_safetensors(b"{}", length=2**63),
        "st_deep": raw_safetensors(b'{"t": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "st_not_json": raw_safetensors(b"{not json at all"),
        "st_list": raw_safetensors(b"[1, 2]"),
        "st_dup": raw_safetensors(b'{"a": ' + j(ok).encode() + b', "a": ' + j(ok).encode() + b"}", bytes(16)),
        "st_overlap": raw_safetensors(j({"a": ok, "b": _entry("F32", [2, 2], 8, 24)}).encode(), bytes(24)),
        "st_negative_shape": raw_safetensors(j({"a": _entry("F32", [-2, 2], 0, 16)}).encode(), bytes(16)),
        "st_huge_shape": raw_safetensors(j({"a": _entry("F32", [2**40, 2**40], 0, 16)}).encode(), bytes(16)),
        "st_bad_dtype": raw_safetensors(j({"a": _entry("F99", [2, 2], 0, 16)}).encode(), bytes(16)),
        "st_truncated": raw_safetensors(j({"a": _entry("F32", [64, 64], 0, 16384)}).encode(), bytes(100)),
        "st_nan_metadata": raw_safetensors(j({"__metadata__": {"sdplan.unet_heads": "nan"}, "a": ok}).encode(), bytes(16)),
        "empty": b"",
        "seven_bytes": b"\x05\x00\x00\x00\x00\x00\x00",
        "random": bytes((i * 7919 + 13) % 256 for i in range(4096)),
        "gguf_version": gguf(version=1),
        "gguf_counts": gguf(n_tensors=2**60, n_kv=2**60),
        "gguf_string": gguf(n_kv=1, body=struct.pack("<Q", 2**62) + b"key"),
        "gguf_array": gguf(n_kv=1, body=struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 2**60)),
        "gguf_truncated": b"GGUF\x03\x00",
        "png_as_model": b"\x89PNG\r\n\x1a\n" + bytes(64),
        "zip_not_torch": _zip({"a.txt": b"hello"}),
        "pickle_global": pickle.dumps(_Evil(), protocol=2),
        "pickle_deep": b"\x80\x02" + b"]" * 200_000 + b"." ,
    }


class _Evil:
    """Pickles as a call of ``os.system`` (which the restricted reader must refuse)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo never run > /dev/null",))


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in entries.items():
            zf.writestr(k, v)
    return buf.getvalue()


def _pth_files(folder: Path) -> dict[str, Path]:
    """Hostile ``.pth`` archives: a zip bomb, a legacy storage claiming past the file, a
    tensor repeating its storage by zero strides, NaN weights."""
    sys.path.insert(0, str(HERE))
    from pth_writer import Tensor, compact_weights, save, save_compact, state_dict

    out: dict[str, Path] = {}
    bomb = folder / "bomb.pth"
    save(state_dict({"w": Tensor.of(np.zeros(1, np.float32))}), bomb)
    with zipfile.ZipFile(bomb) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}
    count = b"X\x03\x00\x00\x00cpuq\x07K\x01"
    entries["bomb/data.pkl"] = entries["bomb/data.pkl"].replace(
        count, count[:-2] + b"J" + struct.pack("<i", 200 << 20))  # 800 MiB of floats
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, data in entries.items():
            if name.endswith("/data/0"):
                with zf.open(name, "w", force_zip64=True) as fh:
                    for _ in range(200):
                        fh.write(bytes(4 << 20))
            else:
                zf.writestr(name, data)
    out["pth_zip_bomb"] = bomb
    legacy = folder / "legacy.pth"
    save(state_dict({"w": Tensor.of(np.zeros(4, np.float32))}), legacy, legacy=True)
    raw = bytearray(legacy.read_bytes())
    at = raw.rindex(struct.pack("<q", 4))
    raw[at:at + 8] = struct.pack("<q", 1 << 40)
    legacy.write_bytes(bytes(raw))
    out["pth_legacy_claim"] = legacy
    t = Tensor.of(np.zeros(4, np.float32))
    wide = folder / "wide.pth"
    save(state_dict({"w": Tensor(t.storage, 0, (1 << 20, 1 << 10), (0, 0))}), wide)
    out["pth_zero_stride"] = wide
    weights = compact_weights()
    weights["body.6.bias"][0] = np.nan
    out["pth_nan_upscaler"] = save_compact(folder / "nan_up.pth", weights)
    return out


def _png(path: Path, chunks: dict[str, str] | None = None, size: tuple[int, int] = (64, 64),
         mode: str = "RGB") -> Path:
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for k, v in (chunks or {}).items():
        info.add_text(k, v)
    Image.new(mode, size, 90).save(path, pnginfo=info)
    return path


def _demo_variant(path: Path, meta: dict[str, str] | None = None,
                  tensors: dict[str, np.ndarray | None] | None = None) -> Path:
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(DEMO), "np") as f:
        m = {**f.metadata(), **(meta or {})}
    d = load_file(str(DEMO))
    for k, v in (tensors or {}).items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    save_file(d, str(path), metadata=m)
    return path


# ----------------------------------------------------------------------------- the cases


def build(root: Path) -> list[Case]:
    """Write the hostile inputs under ``root/inputs`` and return every case (at least 150)."""
    ins, out = root / "inputs", root / "out"
    ins.mkdir(parents=True, exist_ok=True)
    out.mkdir(exist_ok=True)
    o = str(out / "o.png")
    cases: list[Case] = []
    pic = _png(ins / "pic.png")
    gen = ["generate", "-W", "64", "-H", "64", "--steps", "1", "-t", "1", "--in-process"]
    demo = [*gen, "-m", str(DEMO), "-p", "a red circle"]

    # JSON readers: --devices, --profile, a shard index, a picture's records
    for name, data in json_payloads().items():
        f = ins / f"{name}.json"
        f.write_bytes(data)
        cases.append(Case(f"devices/{name}", ["plan", "--devices", str(f), "--model-profile", "sd15-f16"],
                          needle="invalid_inventory"))
        cases.append(Case(f"profile/{name}", ["plan", "--profile", str(f)]))
        comp = ins / f"index_{name}" / "unet"
        comp.mkdir(parents=True)
        (comp / "diffusion_pytorch_model.safetensors.index.json").write_bytes(data)
        cases.append(Case(f"index/{name}", ["inspect", "--diffusion-model", str(comp)],
                          needle="shard index"))
        rec = data.decode("latin-1")[:900_000]  # a PNG text chunk holds up to 1 MB
        png = _png(ins / f"record_{name}.png", {"sdplan": rec, "parameters": "x\nSteps: 4, SDCPP: " + rec})
        cases.append(Case(f"record/{name}", [*gen, "--from-image", str(png), "-o", o]))
        cases.append(Case(f"queue/{name}", reader="queue", path=str(f)))
        cases.append(Case(f"session/{name}", reader="session", path=str(f)))
    cache = ins / "cache_deep.json"
    cache.write_bytes(json_payloads()["deep_array"])
    cases.append(Case("library/cache_deep", ["library", str(ins / "lib"), "--cache", str(cache)],
                      expect=(0,)))
    (ins / "lib").mkdir()
    (ins / "lib" / "m.safetensors").write_bytes(model_payloads()["st_deep"])

    # model files: as -m, to inspect, as a LoRA, as an upscaler
    for name, data in model_payloads().items():
        f = ins / f"{name}.safetensors"
        f.write_bytes(data)
        cases.append(Case(f"model/{name}", [*gen, "-m", str(f), "-p", "x", "-o", o]))
        cases.append(Case(f"inspect/{name}", ["inspect", str(f)], needle="invalid_model_file"))
        if name.startswith(("pickle", "zip", "empty", "random")):
            up = ins / f"{name}.pth"
            up.write_bytes(data)
            cases.append(Case(f"upscaler/{name}", ["upscale", "-i", str(pic), "--upscale-model",
                                                   str(up), "-o", o, "-t", "1"]))
    loras = ins / "loras"
    loras.mkdir()
    for name in ("st_deep", "st_truncated", "random", "pickle_global", "pickle_deep"):
        ext = ".pt" if name.startswith("pickle") else ".safetensors"
        (loras / f"{name}{ext}").write_bytes(model_payloads()[name])
        cases.append(Case(f"lora/{name}", [*demo, "-p", f"a red circle <lora:{name}:1>",
                                           "--lora-model-dir", str(loras), "-o", o]))
    for name, path in _pth_files(ins).items():
        cases.append(Case(f"upscaler/{name}", ["upscale", "-i", str(pic), "--upscale-model",
                                               str(path), "-o", o, "-t", "1"]))
        if name != "pth_nan_upscaler":
            cases.append(Case(f"lora_pth/{name}", [*demo, "-p", "a red circle <lora:x:1>",
                                                   "--lora-model-dir", str(ins / f"lora_{name}"), "-o", o]))
            (ins / f"lora_{name}").mkdir()
            os.link(path, ins / f"lora_{name}" / "x.pt")

    # model files whose numbers or layout lie
    p = "model.diffusion_model."
    nan = np.asarray(load_tensor(f"{p}input_blocks.0.0.weight")).copy()
    nan.flat[0] = np.nan
    for name, kw in {
        "nan_weights": {"tensors": {f"{p}input_blocks.0.0.weight": nan}},
        "heads_0": {"meta": {"sdplan.unet_heads": "0"}},
        "heads_3": {"meta": {"sdplan.unet_heads": "3"}},
        "clip_heads_3": {"meta": {"sdplan.clip_heads": "3"}},
        "wide_block": {"tensors": {f"{p}input_blocks.1.0.out_layers.3.weight": np.zeros((72, 64, 3, 3), np.float32),
                                   f"{p}input_blocks.1.0.out_layers.3.bias": np.zeros(72, np.float32)}},
        "no_upsample": {"tensors": {f"{p}output_blocks.1.2.conv.weight": None, f"{p}output_blocks.1.2.conv.bias": None}},
    }.items():
        f = _demo_variant(ins / f"{name}.safetensors", **kw)  # type: ignore[arg-type]
        cases.append(Case(f"layout/{name}", [*gen, "-m", str(f), "-p", "a red circle", "-o", o]))

    # paths that are not files
    fifo = ins / "fifo.safetensors"
    os.mkfifo(fifo)
    loop = ins / "loop.safetensors"
    loop.symlink_to(loop)
    dangling = ins / "dangling.safetensors"
    dangling.symlink_to(ins / "nowhere")
    for name, path in (("fifo", fifo), ("dev_zero", Path("/dev/zero")), ("folder", ins),
                       ("loop", loop), ("dangling", dangling), ("missing", ins / "none.safetensors"),
                       ("too_long", ins / ("n" * 5000))):
        cases.append(Case(f"path/model_{name}", [*gen, "-m", str(path), "-p", "x", "-o", o]))
        cases.append(Case(f"path/init_{name}", [*demo, "-i", str(path), "-o", o]))
        cases.append(Case(f"path/devices_{name}", ["plan", "--devices", str(path), "--model-profile", "sd15-f16"]))
    cases.append(Case("path/output_too_long", [*demo, "-o", str(out / ("n" * 5000)) + ".png"]))
    cases.append(Case("path/preview_too_long", [*demo, "-o", o, "--preview-path", str(out / ("n" * 5000))]))
    cases.append(Case("path/output_in_proc", [*demo, "-o", "/proc/sdplan-test/o.png"]))
    cases.append(Case("path/output_folder", [*demo, "-o", str(out) + "/"]))
    cases.append(Case("path/output_txt", [*demo, "-o", str(out / "o.txt")]))
    cases.append(Case("path/preview_is_file", [*demo, "-o", o, "--preview-path", str(pic)]))
    cases.append(Case("path/library_too_long", ["library", str(ins / ("n" * 5000))]))
    cases.append(Case("path/lora_too_long", [*demo, "-p", f"x <lora:{'n' * 5000}:1>", "-o", o]))

    # outputs over inputs
    model_copy = ins / "model.png"
    model_copy.write_bytes(DEMO.read_bytes())
    up_copy = ins / "up.png"
    up_copy.write_bytes(model_payloads()["zip_not_torch"])
    cases += [
        Case("overwrite/model", [*gen, "-m", str(model_copy), "-p", "x", "-o", str(model_copy)], needle="same file"),
        Case("overwrite/upscaler", ["upscale", "-i", str(pic), "--upscale-model", str(up_copy), "-o", str(up_copy)],
             needle="same file"),
        Case("overwrite/init", [*demo, "-i", str(pic), "-o", str(pic)], needle="same file"),
        Case("overwrite/profile", ["inspect", str(model_copy), "--write-profile", str(model_copy)], needle="same file"),
    ]

    # flags
    for name, extra in {
        "width_0": ["-W", "0"], "width_huge": ["-W", "100000"], "width_text": ["-W", "wide"],
        "steps_0": ["--steps", "0"], "steps_huge": ["--steps", "100000"],
        "cfg_nan": ["--cfg-scale", "nan"], "cfg_inf": ["--cfg-scale", "inf"], "cfg_huge": ["--cfg-scale", "1e308"],
        "guidance_negative": ["--guidance", "-1"], "seed_huge": ["-s", str(2**70)],
        "batch_0": ["-b", "0"], "batch_huge": ["-b", "1000"], "threads_negative": ["-t", "-1"],
        "clip_skip_huge": ["--clip-skip", "99"], "vae_tile_huge": ["--vae-tile-size", "100000"],
        "upscale_repeats": ["--upscale-repeats", "10"], "strength_2": ["-i", str(pic), "--strength", "2"],
        "strength_nan": ["-i", str(pic), "--strength", "nan"], "mask_alone": ["--mask", str(pic)],
        "sigmas_nan": ["--sigmas", "nan,1"], "sigmas_negative": ["--sigmas", "1,-1"],
        "sigmas_many": ["--sigmas", ",".join(["1"] * 3000)], "sigmas_huge": ["--sigmas", "1e308,1"],
        "sigmas_text": ["--sigmas", "a,b"], "sigmas_empty": ["--sigmas", ","],
        "sigmas_overflow": ["--sigmas", "3e38,1"],
        "lora_weight_huge": ["-p", "x <lora:outline:1e308>", "--lora-model-dir", str(LORA.parent)],
        "lora_weight_nan": ["-p", "x <lora:outline:nan>", "--lora-model-dir", str(LORA.parent)],
        "lora_weight_text": ["-p", "x <lora:outline:heavy>", "--lora-model-dir", str(LORA.parent)],
        "lora_missing": ["-p", "x <lora:nothere:1>", "--lora-model-dir", str(LORA.parent)],
        "sampler_unknown": ["--sampling-method", "warp"], "scheduler_unknown": ["--scheduler", "zigzag"],
        "rng_unknown": ["--rng", "dice"], "extra_args": ["--extra-sample-args", "novalue"],
        "skip_layers": ["--skip-layers", "[a,b]"], "slg_nan": ["--slg-scale", "nan"],
        "flux_axes": ["--flux-axes", "a,b"], "unet_heads_0": ["--unet-heads", "0"],
        "unet_heads_3": ["--unet-heads", "3"], "clip_heads_3": ["--clip-heads", "3"],
        "prompt_huge": ["-p", "x" * 200_000], "negative_huge": ["-n", "y" * 200_000],
        "max_vram_text": ["--max-vram", "lots"], "max_vram_nan": ["--max-vram", "CPU=nan"],
        "max_vram_overflow": ["--max-vram", "CPU=1e400"], "backend_garbage": ["--backend", "diffusion=☃,te"],
        "backend_long": ["--backend", "x" * 100_000], "params_backend_bad": ["--params-backend", "vae=nowhere"],
        "rpc_bad": ["--rpc-servers", "host:notaport"], "unknown_flag": ["--frobnicate"],
        "sdcli_unsupported": ["--control-net", "x.safetensors"], "demo_and_model": ["--demo"],
        "timestep_shift": ["--timestep-shift", "5000"],
    }.items():
        cases.append(Case(f"flag/{name}", [*demo, "-o", o, *extra]))
    for name, extra in {
        "width_text": ["-W", "x"], "batch_0": ["-b", "0"], "backend_unicode": ["--backend", "💥=CPU"],
        "max_vram_bad": ["--max-vram", "CUDA0=abc"], "unknown_profile": ["--model-profile", "nope"],
        "profile_and_files": ["--model-profile", "sd15-f16", "-m", str(DEMO)],
        "command_garbage": ["--command", "sd-cli --steps"], "engine_unknown": ["--engine", "comfy"],
    }.items():
        cases.append(Case(f"plan_flag/{name}", ["plan", *extra]))
    cases.append(Case("upscale/repeats", ["upscale", "-i", str(pic), "--upscale-model", str(DEMO),
                                          "--upscale-repeats", "9", "-o", o]))
    cases.append(Case("upscale/tile", ["upscale", "-i", str(pic), "--upscale-model", str(DEMO),
                                       "--upscale-tile", "1", "-o", o]))
    return cases


def load_tensor(name: str) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(DEMO), "np") as f:
        return f.get_tensor(name)


# ----------------------------------------------------------------------------- running


READERS: dict[str, Callable[[str], object]] = {}


def _queue(path: str) -> object:
    """A queue file read as the app reads it at start-up, from a copy under ``out`` (a file
    that cannot be read is set aside there, as designed); its note is the refusal."""
    import shutil

    from sdplan.core.pipelines.job_queue import JobQueue

    work = Path(path).parent.parent / "out" / f"queue-{Path(path).name}"
    shutil.copyfile(path, work)
    q = JobQueue(work)
    if q.notes:
        raise ValueError(q.notes[0])
    return q


def _session(path: str) -> object:
    from sdplan.core.planning.bounded_json import loads
    from sdplan.core.planning.session import read_plan_document

    return read_plan_document(loads(Path(path).read_bytes(), path))


READERS.update(queue=_queue, session=_session)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        with contextlib.suppress(OSError):
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_case(case: Case) -> tuple[int, str]:
    """Run one case in this process: ``(exit code, stderr)``; a reader's exception is
    exit 2 with its message as the line."""
    from sdplan.core.cli import main
    from sdplan.core.errors import SdplanError

    err = io.StringIO()
    if case.reader:
        try:
            READERS[case.reader](case.path)
            return 0, ""
        except (SdplanError, OSError, ValueError, TypeError, KeyError) as exc:
            return 2, f"error: {' '.join(str(exc).split())[:400]}\n"
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(case.argv)
        except SystemExit as exc:  # argparse's --help paths
            code = int(exc.code or 0)
    return code, err.getvalue()


def check(case: Case, code: int, stderr: str) -> str | None:
    """Why the case's result breaks the rules (module docstring), or None."""
    if "Traceback" in stderr or "Exception" in stderr:
        return f"traceback: {stderr[-300:]}"
    if code not in case.expect:
        return f"exit {code}, expected {case.expect}: {stderr[-300:]}"
    if code == 2:
        lines = [ln for ln in stderr.splitlines() if ln.startswith(("error", "sdplan"))]
        if len(lines) != 1:
            return f"{len(lines)} error lines: {stderr[-300:]}"
        if case.needle and case.needle not in lines[0]:
            return f"the line lacks {case.needle!r}: {lines[0][:300]}"
    return None


def peak_kib() -> int:
    """This process's peak resident memory (KiB): ``VmHWM`` of ``/proc/self/status`` where
    there is one (the peak of this program alone: Linux keeps ``ru_maxrss`` across ``execve``,
    so a child of a large process would report its parent's size), else ``ru_maxrss``."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_all(root: Path) -> dict[str, object]:
    """Build the corpus under ``root``, run every case and check it (module docstring)."""
    os.environ.setdefault("SDPLAN_CACHE_DIR", str(root / "cache"))
    cases = build(root)
    ins = root / "inputs"
    before = _digests(ins) | {str(DEMO): hashlib.sha256(DEMO.read_bytes()).hexdigest()}
    failures: dict[str, str] = {}
    snap = _snapshot(ins)
    for case in cases:
        code, stderr = run_case(case)
        why = check(case, code, stderr)
        now = _snapshot(ins)
        if now != snap:
            changed = sorted(k for k in set(now) | set(snap) if now.get(k) != snap.get(k))
            why = (why + "; " if why else "") + f"inputs changed: {changed[:3]}"
            snap = now
        if why:
            failures[case.name] = why
    after = _digests(ins) | {str(DEMO): hashlib.sha256(DEMO.read_bytes()).hexdigest()}
    return {"cases": len(cases), "failures": failures,
            "changed": sorted(k for k in before if before[k] != after.get(k)),
            "peak_kib": peak_kib()}


if __name__ == "__main__":
    print(json.dumps(run_all(Path(sys.argv[1]))))
