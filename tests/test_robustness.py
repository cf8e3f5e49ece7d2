"""Runs that hold up: each failure a new user met, reproduced.

Thread choice under affinity and load; output locations checked before any model loads;
atomic writes and late failures; flag limits; input pictures of every mode; a closed
output pipe; one-line errors with their real codes; Qt's platform plugin.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pth_writer import compact_weights, save_compact
from rpc_util import sdplan_cmd
from sdplan.core.errors import InvalidArgument, OutputError, PlanError
from sdplan.core.runtime import threads as th

PROC_DIR = "/proc/sdplan-test"  # a folder no one can create files in, root included


def sdplan(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(sdplan_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


def one_line_error(stderr: str, code: str) -> str:
    """The single error line of ``stderr`` with ``code``; no traceback anywhere."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error [{code}]: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def upscaler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_compact(tmp_path_factory.mktemp("up") / "compact_x2.pth", compact_weights())


@pytest.fixture(scope="module")
def small_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("in") / "in.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    return path


# ---------------------------------------------------------------------------- threads


def _sample(busy: list[int], total: list[int], own: float, wall: float) -> th.CpuSample:
    return th.CpuSample(wall, own, tuple(busy), tuple(total))


def test_other_load_subtracts_this_process() -> None:
    """2 CPUs, 1 s: 150 of 200 ticks busy (1.5 cores), 0.5 s of it ours -> 1.0 elsewhere."""
    a = _sample([0, 0], [0, 0], 0.0, 10.0)
    b = _sample([75, 75], [100, 100], 0.5, 11.0)
    assert th.other_load(a, b) == pytest.approx(1.0)
    assert th.other_load(a, _sample([], [], 0.5, 11.0)) is None


def _loaded(monkeypatch: pytest.MonkeyPatch, busy0: int, busy1: int) -> None:
    """The next measuring window: 1 s on 2 CPUs, ``busy0``/``busy1`` of 100 ticks busy on
    each, none of it this process's."""
    samples = iter([_sample([busy0, busy1], [100, 100], 0.0, 1.0)])
    monkeypatch.setattr(th, "_mark", _sample([0, 0], [0, 0], 0.0, 0.0))
    monkeypatch.setattr(th.CpuSample, "now", classmethod(lambda cls, cpus=None: next(samples)))


def test_thread_count_follows_affinity_and_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th, "usable_cpus", lambda: [0])  # taskset -c 0
    assert th.choose_threads().threads == 1
    assert th.choose_threads(8).threads == 1 and "capped" in th.choose_threads(8).reason
    monkeypatch.setattr(th, "usable_cpus", lambda: [0, 1])
    assert th.choose_threads(2, measure=False).threads == 2
    assert th.choose_threads(1).threads == 1
    assert th.choose_threads(0, measure=False).threads == 2
    with pytest.raises(ValueError):
        th.choose_threads(-1)
    # one core busy elsewhere over the window -> 1 thread, and the reason says so
    _loaded(monkeypatch, 100, 0)
    choice = th.choose_threads()
    assert (choice.threads, round(choice.busy_elsewhere or 0, 2)) == (1, 1.0)
    assert "1.0 cores busy with other programs" in choice.reason
    # -t 2 is an upper limit: lowered the same way, never raised
    _loaded(monkeypatch, 100, 0)
    assert th.choose_threads(2).threads == 1
    _loaded(monkeypatch, 10, 5)  # an idle machine -> every usable CPU
    assert th.choose_threads().threads == 2
    _loaded(monkeypatch, 10, 5)
    assert th.choose_threads(8).threads == 2


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_backend_default_is_the_affinity_mask_not_cpu_count() -> None:
    """Under ``taskset -c 0`` the engine's default is 1 thread even on a larger machine."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
            "from sdplan.core.runtime.devices import BackendManager;"
            "m = BackendManager(); print(m.cpu_threads, os.cpu_count()); m.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[0] == "1"


# ---------------------------------------------------------------------------- limits


@pytest.mark.parametrize("flags,needle", [
    (["--steps", "1000000000"], "--steps must be between 1 and 1000"),
    (["--cfg-scale", "1e308"], "--cfg-scale must be between -100 and 100"),
    (["--cfg-scale", "nan"], "--cfg-scale must be a finite number"),
    (["--guidance", "inf"], "--guidance must be a finite number"),
    (["-W", "100000"], "-W/--width must be between 1 and 8192"),
    (["-b", "100000"], "-b/--batch-count must be between 1 and 100"),
    (["-s", str(10**30)], "-s/--seed must be between"),
    (["-p", "x" * 20000], "-p/--prompt is 20000 characters long; at most 10000"),
])
def test_generate_limits_are_one_line_errors_before_loading(flags: list[str], needle: str,
                                                            tmp_path: Path) -> None:
    t0 = time.monotonic()
    args = ["generate", "--demo", "-p", "a red circle on a blue background", "--in-process",
            "-o", str(tmp_path / "x.png"), *flags]
    r = sdplan(*args)
    assert r.returncode == 2
    line = one_line_error(r.stderr, "invalid_argument")
    assert needle in line and len(line) < 300
    assert not (tmp_path / "x.png").exists() and time.monotonic() - t0 < 60


def test_max_vram_overflow_is_an_error(tmp_path: Path) -> None:
    r = sdplan("plan", "--model-profile", "sd15-f16", "--max-vram", "1e400")
    assert r.returncode == 2
    assert "out of range" in one_line_error(r.stderr, "invalid_max_vram")


# ---------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("out,needle", [
    (f"{PROC_DIR}/out.png", "cannot create the folder"),
    ("/proc/out.png", "cannot write files in this folder"),
    ("noext", "has no extension"),
    ("out.xyz", "has the extension '.xyz'"),
])
def test_upscale_output_is_checked_before_the_model_loads(out: str, needle: str, tmp_path: Path,
                                                          small_png: Path) -> None:
    """A model that does not exist proves the order: the output error comes first."""
    target = out if out.startswith("/") else str(tmp_path / out)
    r = sdplan("upscale", "-i", str(small_png), "--upscale-model", str(tmp_path / "none.pth"),
               "-o", target)
    assert r.returncode == 2
    assert needle in one_line_error(r.stderr, "output_unwritable")


def test_upscale_output_in_a_file_used_as_folder(tmp_path: Path, small_png: Path,
                                                 upscaler: Path) -> None:
    (tmp_path / "afile").write_text("x")
    r = sdplan("upscale", "-i", str(small_png), "--upscale-model", str(upscaler),
               "-o", str(tmp_path / "afile" / "out.png"))
    assert r.returncode == 2
    one_line_error(r.stderr, "output_unwritable")


def test_upscale_creates_a_missing_folder(tmp_path: Path, small_png: Path, upscaler: Path) -> None:
    out = tmp_path / "new" / "deeper" / "out.webp"
    r = sdplan("upscale", "-i", str(small_png), "--upscale-model", str(upscaler), "-o", str(out),
               "-t", "1")
    assert r.returncode == 0, r.stderr
    with Image.open(out) as im:
        assert im.format == "WEBP" and im.size == (32, 32)
    assert [p.name for p in out.parent.iterdir()] == ["out.webp"]  # no temporary left


# ---------------------------------------------------------------------------- model paths

DEMO_MODEL = "{demo}"  # replaced by the demo model's path


def _special(tmp_path: Path, kind: str) -> tuple[str, str]:
    """A path of ``kind`` (``fifo``: made in ``tmp_path``; ``chardev``: /dev/null) and how
    the error names it."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.safetensors")
        return str(tmp_path / "pipe.safetensors"), "a FIFO"
    return "/dev/null", "a character device"


@pytest.mark.parametrize(("argv", "kind"), [
    (["plan", "-m", "{p}"], "fifo"),
    (["plan", "-m", "{p}"], "chardev"),
    (["plan", "-m", DEMO_MODEL, "--vae", "{p}"], "fifo"),
    (["inspect", "{p}"], "fifo"),
    (["inspect", "{p}"], "chardev"),
    (["generate", "-p", "x", "-m", "{p}"], "fifo"),
    (["generate", "-p", "x", "--diffusion-model", "{p}"], "chardev"),
    (["generate", "--demo", "-p", "x", "--taesd", "{p}"], "fifo"),
    (["generate", "--demo", "-p", "x", "--taesd", "{p}"], "chardev"),
    (["generate", "--demo", "-p", "x", "--upscale-model", "{p}"], "fifo"),
    (["upscale", "-i", "{png}", "--upscale-model", "{p}"], "fifo"),
    (["upscale", "-i", "{png}", "--upscale-model", "{p}"], "chardev"),
], ids=lambda v: v if isinstance(v, str) else "-".join(a for a in v if not a.startswith("{")))
def test_a_fifo_or_device_as_model_path_is_named_before_any_work(argv: list[str], kind: str,
                                                                 tmp_path: Path,
                                                                 small_png: Path) -> None:
    """Named for what it is (never a folder), exit 2 on one line, before the engine samples
    or anything is written; a FIFO is never opened (that would wait for a writer)."""
    from sdplan.core.pipelines.demo.model import demo_model_path

    path, what = _special(tmp_path, kind)
    out = tmp_path / "out.png"
    values = {"{p}": path, "{png}": str(small_png), DEMO_MODEL: str(demo_model_path())}
    writes = ["-o", str(out)] if argv[0] in ("generate", "upscale") else []
    r = sdplan(*[values.get(a, a) for a in argv], *writes, timeout=120)
    assert r.returncode == 2, r.stderr
    assert one_line_error(r.stderr, "invalid_model_file") == (
        f"error [invalid_model_file]: {path}: not a regular file ({what})")
    assert "sampling" not in r.stderr and "CPU threads" not in r.stderr and r.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(("argv", "kind", "line"), [
    (["-i", "{p}"], "fifo", "error [invalid_argument]: -i/--init-img '{p}': not a readable picture "
                            "({p}: not a regular file ({what}))"),
    (["-i", "{png}", "--mask", "{p}"], "fifo", "error [invalid_argument]: --mask '{p}': not a readable "
                                               "picture ({p}: not a regular file ({what}))"),
    (["-i", "{p}"], "chardev", "error [invalid_argument]: -i/--init-img '{p}': not a readable picture "
                               "({p}: not a regular file ({what}))"),
    (["--from-image", "{p}"], "fifo", "sdplan generate: --from-image {p}: not a regular file ({what})"),
], ids=["init-fifo", "mask-fifo", "init-chardev", "from-image-fifo"])
def test_a_fifo_or_device_as_picture_input_is_named_before_any_work(argv: list[str], kind: str, line: str,
                                                                   tmp_path: Path, small_png: Path) -> None:
    """-i, --mask and --from-image refuse a FIFO or a device in one line, exit 2, without
    opening it (a FIFO would wait for a writer) and before anything is sampled or written."""
    path, what = _special(tmp_path, kind)
    out = tmp_path / "out.png"
    values = {"{p}": path, "{png}": str(small_png)}
    r = sdplan("generate", "--demo", "-p", "x", *[values.get(a, a) for a in argv], "-o", str(out), timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1] == line.format(p=path, what=what), r.stderr
    assert "sampling" not in r.stderr and r.stdout == "" and not out.exists()


def test_a_fifo_in_a_library_folder_is_listed_not_read(tmp_path: Path) -> None:
    import json

    os.mkfifo(tmp_path / "pipe.safetensors")
    r = sdplan("library", "--json", "--cache", str(tmp_path / "cache.json"), str(tmp_path),
               timeout=120)
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    assert [(Path(f["path"]).name, f["error"]) for f in files] == [
        ("pipe.safetensors", "not a regular file (a FIFO)")]


def _limit_file_size(limit: int):  # type: ignore[no-untyped-def]
    """preexec_fn: files larger than ``limit`` bytes fail with EFBIG, as on a full disk
    (Python ignores SIGXFSZ)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_upscale_full_disk_leaves_no_partial_file(tmp_path: Path, upscaler: Path) -> None:
    src = tmp_path / "big.png"
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(src)
    out = tmp_path / "out" / "up.png"
    r = sdplan("upscale", "-i", str(src), "--upscale-model", str(upscaler), "-o", str(out),
               "-t", "1", preexec_fn=_limit_file_size(4096))
    assert r.returncode == 2
    assert "the image is lost" in one_line_error(r.stderr, "output_unwritable")
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_late_write_failure_keeps_the_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``generate``'s writer: the -o location fails after sampling (disk full) -> the image
    goes to the temporary folder and the warning names both places."""
    from rich.console import Console
    from sdplan.core.commands.generate import write_images
    from sdplan.core.pipelines.stages import outputs, results

    spare_dir = tmp_path / "spare"
    spare_dir.mkdir()
    monkeypatch.setattr(outputs, "fallback_folder", lambda: spare_dir)
    real = results.atomic_write

    def full_disk(path, write):  # type: ignore[no-untyped-def]
        if Path(path).parent == tmp_path / "full":
            raise OSError(28, "No space left on device")
        return real(path, write)

    monkeypatch.setattr(results, "atomic_write", full_disk)
    img = np.full((8, 8, 3), 200, np.uint8)
    console = Console(stderr=True, soft_wrap=True)
    assert write_images([img], tmp_path / "full" / "x.png", {"prompt": "p"}, console) == 0
    err = capsys.readouterr()
    saved = Path(err.out.strip())
    assert saved.parent == spare_dir and "No space left on device" in err.err
    assert str(saved) in err.err.replace("\n", "")
    assert np.array_equal(np.asarray(Image.open(saved)), img)
    assert results.read_png_text(saved)["prompt"] == "p"


def test_atomic_write_failure_keeps_the_old_file(tmp_path: Path) -> None:
    from sdplan.core.pipelines.stages.outputs import atomic_write

    target = tmp_path / "keep.txt"
    target.write_text("old")

    def half(tmp: Path) -> None:
        tmp.write_text("new, but cut")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, half)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_generate_preview_folder_is_checked_first(tmp_path: Path) -> None:
    r = sdplan("generate", "--demo", "-p", "a red circle on a blue background", "--in-process",
               "-o", str(tmp_path / "x.png"), "--preview-path", PROC_DIR)
    assert r.returncode == 2
    assert "--preview-path" in one_line_error(r.stderr, "output_unwritable")


def test_check_output_folder_reports_a_full_disk(tmp_path: Path) -> None:
    from sdplan.core.pipelines.stages.outputs import check_output_folder

    st = os.statvfs(tmp_path)
    with pytest.raises(OutputError, match="MiB free"):
        check_output_folder("-o/--output", tmp_path, needed_bytes=st.f_bavail * st.f_frsize + 1)
    assert check_output_folder("-o/--output", tmp_path, needed_bytes=1) == tmp_path


@pytest.mark.slow
def test_generate_survives_a_preview_write_failure_and_a_full_disk(tmp_path: Path) -> None:
    """The preview folder vanishes mid-run (a file takes its place): previews stop with a
    warning, the image is still written. Then -o on a "full disk" (file size limit): one
    line, no partial file."""
    prev = tmp_path / "prev"
    out = tmp_path / "o" / "x.png"
    code = ("import sys, shutil, pathlib, sdplan.core.pipelines.stages.results as r\n"
            "orig = r.save_png\n"
            "def once(img, path, text=None):\n"
            "    p = pathlib.Path(path)\n"
            "    if p.parent.name == 'prev' and p.parent.is_dir():\n"
            "        shutil.rmtree(p.parent); p.parent.write_text('now a file')\n"
            "    return orig(img, path, text)\n"
            "r.save_png = once\n"
            "from sdplan.core.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    args = ["generate", "--demo", "-p", "a red circle on a blue background", "--steps", "2",
            "-t", "1", "-o", str(out), "--preview-path", str(prev)]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "previews stop" in r.stderr and out.exists() and "Traceback" not in r.stderr
    out2 = tmp_path / "full" / "x.png"
    r = sdplan("generate", "--demo", "-p", "a red circle on a blue background", "--steps", "2",
               "-t", "1", "-o", str(out2), preexec_fn=_limit_file_size(2048), timeout=600)
    assert r.returncode == 2
    assert "the image is lost" in r.stderr and "Traceback" not in r.stderr
    assert list(out2.parent.iterdir()) == []


# ---------------------------------------------------------------------------- input images


def _modes(tmp_path: Path) -> list[tuple[str, Path, np.ndarray]]:
    """(name, file, expected RGB) for pictures of many modes."""
    out = []
    grey16 = np.array([[0, 257 * 128, 65535]], np.uint16)
    p = tmp_path / "grey16.png"
    Image.fromarray(grey16).save(p)  # Pillow writes a 16-bit greyscale PNG
    out.append(("16-bit grey", p, np.repeat(np.array([[0, 128, 255]], np.uint8)[..., None], 3, 2)))
    rgba = np.array([[[255, 0, 0, 255], [0, 0, 255, 0], [0, 255, 0, 128]]], np.uint8)
    p = tmp_path / "rgba.png"
    Image.fromarray(rgba, "RGBA").save(p)
    out.append(("RGBA over white", p, np.array([[[255, 0, 0], [255, 255, 255], [127, 255, 127]]],
                                               np.uint8)))
    pal = Image.new("P", (2, 1))
    pal.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    pal.putpixel((0, 0), 0)
    pal.putpixel((1, 0), 1)
    p = tmp_path / "pal.png"
    pal.save(p)
    out.append(("palette", p, np.array([[[10, 20, 30], [200, 100, 50]]], np.uint8)))
    p = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (2, 2), (0, 0, 0, 0)).save(p, quality=100)
    out.append(("CMYK", p, np.full((2, 2, 3), 255, np.uint8)))
    p = tmp_path / "la.png"
    Image.fromarray(np.array([[[0, 255], [0, 0]]], np.uint8), "LA").save(p)
    out.append(("LA", p, np.array([[[0, 0, 0], [255, 255, 255]]], np.uint8)))
    p = tmp_path / "float.tif"
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32), "F").save(p)
    out.append(("float", p, np.repeat(np.array([[0, 128, 255]], np.uint8)[..., None], 3, 2)))
    return out


def test_every_picture_mode_converts_by_value(tmp_path: Path) -> None:
    from sdplan.core.pipelines.stages.images import read_image_rgb

    for name, path, want in _modes(tmp_path):
        got = read_image_rgb(path)
        assert got.dtype == np.uint8 and got.shape == want.shape, name
        assert np.abs(got.astype(int) - want).max() <= 1, (name, got, want)


def test_upscale_input_too_large_for_its_repeats(tmp_path: Path, upscaler: Path) -> None:
    src = tmp_path / "wide.png"
    Image.new("RGB", (3000, 8)).save(src)
    r = sdplan("upscale", "-i", str(src), "--upscale-model", str(upscaler), "-o",
               str(tmp_path / "o.png"), "--upscale-repeats", "2")
    assert r.returncode == 2
    assert "3000x8" in one_line_error(r.stderr, "invalid_argument")


def test_upscale_16bit_grey_is_not_white(tmp_path: Path, upscaler: Path) -> None:
    src = tmp_path / "g16.png"
    Image.fromarray(np.full((16, 16), 257 * 60, np.uint16)).save(src)
    out = tmp_path / "g16_up.png"
    r = sdplan("upscale", "-i", str(src), "--upscale-model", str(upscaler), "-o", str(out),
               "-t", "1")
    assert r.returncode == 0, r.stderr
    got = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert abs(got.mean() - 60) < 40, got.mean()  # a random-weight model: near, not white


# ---------------------------------------------------------------------------- output


def _generate_until_the_reader_goes(out: Path, stderr: int) -> tuple[subprocess.Popen, bytes]:
    """Start a 2-step demo generation writing ``out`` with stdout piped (and stderr as given),
    read its first line and close the pipe, as ``| head -1`` does: the process, its first line."""
    proc = subprocess.Popen(sdplan_cmd("generate", "--demo", "-p", "a red circle on a blue "
                                       "background", "--steps", "2", "-t", "1", "-o", str(out)),
                            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    return proc, first


def test_broken_pipe_is_quiet_and_keeps_the_image(tmp_path: Path) -> None:
    """``sdplan generate ... | head -1``: exit 0, no message, the image written."""
    out = tmp_path / "x.png"
    proc, _ = _generate_until_the_reader_goes(out, subprocess.PIPE)
    _, err = proc.communicate(timeout=600)
    text = err.decode()
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "Broken pipe" not in text and "error" not in text
    assert out.exists()


def test_broken_pipe_on_stderr_is_quiet_and_keeps_the_image(tmp_path: Path) -> None:
    """``sdplan generate ... 2>&1 | head -1``: the reader goes away while the plan's tables and
    the progress go to stderr: exit 0 and the image written (it exited 1 without the image)."""
    out = tmp_path / "x.png"
    proc, first = _generate_until_the_reader_goes(out, subprocess.STDOUT)
    assert proc.wait(timeout=600) == 0, first
    assert out.exists() and out.stat().st_size > 0


def test_errors_are_whole_lines_with_real_codes() -> None:
    long_value = "te=" + "x" * 100_000
    r = sdplan("plan", "--model-profile", "sd15-f16", "--backend", long_value)
    assert r.returncode == 2
    line = one_line_error(r.stderr, "device_not_found")
    assert len(r.stderr) < 1000 and "100003 characters" not in line and "…" in line
    r = sdplan("generate", "--demo", "-m", "x.safetensors", "-p", "p")
    one_line_error(r.stderr, "invalid_argument")
    assert len(r.stderr.splitlines()) == 1  # not wrapped at 80 columns


def test_error_line_and_excerpt() -> None:
    from sdplan.core.commands.messages import error_line, excerpt, shorten

    exc = PlanError("unknown_module", "bad", flag="--backend", text="a" * 500, span=(400, 405))
    assert error_line(exc) == "error [unknown_module]: bad (at --backend characters 401-405)"
    shown, caret, length = excerpt("a" * 500, (400, 405))
    assert shown.startswith("…") and shown.endswith("…") and shown[caret:caret + length] == "aaaaa"
    assert len(shown) < 100
    assert error_line(InvalidArgument("x")).startswith("error [invalid_argument]: x")
    assert len(shorten("y" * 100_000)) < 450


def test_a_terminal_gets_the_flag_text_with_carets() -> None:
    import io

    from sdplan.core.commands.messages import print_error

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    text = "te=cpu,diffusion=" + "x" * 200 + ",vae=cuda9"
    start = text.index("cuda9")
    print_error(PlanError("device_not_found", "--backend: no device 'cuda9'", flag="--backend",
                          text=text, span=(start, start + 5)), out)
    import re

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in out.getvalue().splitlines()]
    assert lines[0] == "error [device_not_found]: --backend: no device 'cuda9'"
    shown, carets = lines[1], lines[2]
    assert shown.startswith("  --backend …") and len(shown) < 120
    col = carets.index("^")
    assert carets.strip() == "^^^^^" and shown[col:col + 5] == "cuda9"


# ---------------------------------------------------------------------------- Qt


def test_missing_qt_library_names_the_packages() -> None:
    from sdplan.core.commands.gui import missing_library_reason

    msg = missing_library_reason("libxcb-cursor.so.0: cannot open shared object file: No such "
                                 "file or directory", "xcb")
    assert "libxcb-cursor.so.0" in msg and "libxcb-cursor0" in msg and "xcb-util-cursor" in msg
    assert "libfoo.so.3" in missing_library_reason("libfoo.so.3: cannot open shared object", "xcb")


def _stand_in_plugin(tmp_path: Path, soname: str, *, calls_it: bool) -> Path:
    """A shared object ``libqxcb.so`` that needs the library ``soname`` (built, then removed
    from ``tmp_path``): the dynamic loader looks for ``soname`` on the system. With
    ``calls_it`` the plugin also calls a function only the stand-in defined."""
    (tmp_path / "a.c").write_text("int sdplan_dep(void) { return 1; }\n")
    body = ("int sdplan_dep(void);\nint plug(void) { return sdplan_dep(); }\n" if calls_it
            else "int plug(void) { return 1; }\n")
    (tmp_path / "p.c").write_text(body)
    dep = tmp_path / soname
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(dep), f"-Wl,-soname,{soname}",
                    str(tmp_path / "a.c")], check=True)
    plugin = tmp_path / "libqxcb.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(plugin), str(tmp_path / "p.c"),
                    "-Wl,--no-as-needed", str(dep)], check=True)
    dep.unlink()
    return plugin


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("cc") is None,
                    reason="needs Linux and a C compiler")
def test_qt_platform_check_names_the_library_a_plugin_lacks(tmp_path: Path) -> None:
    """A plugin linked against a library that is then removed: the check names that library
    (Qt would abort naming the plugin). A library no system has is always named; for
    libxcb-icccm.so.4 (which a machine with a desktop has) the package is named where the
    library is missing, and the plugin loads where it is present."""
    from sdplan.core.commands.gui import qt_platform_reason

    (tmp_path / "invented").mkdir()
    invented = _stand_in_plugin(tmp_path / "invented", "libsdplan-stand-in.so.7", calls_it=True)
    reason = qt_platform_reason("xcb", invented)
    assert reason is not None and "libsdplan-stand-in.so.7" in reason, reason

    (tmp_path / "icccm").mkdir()
    plugin = _stand_in_plugin(tmp_path / "icccm", "libxcb-icccm.so.4", calls_it=False)
    env_has = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libxcb-icccm.so.4')"],
                             capture_output=True).returncode == 0
    reason = qt_platform_reason("xcb", plugin)
    if env_has:  # the system has it: the plugin loads
        assert reason is None, reason
    else:
        assert reason is not None and "libxcb-icccm.so.4" in reason and "libxcb-icccm4" in reason


def test_sdplan_with_a_display_but_no_xcb_libraries_says_what_to_install() -> None:
    from sdplan.core.commands.gui import qt_platform_reason

    expected = qt_platform_reason("xcb")
    if expected is None:
        pytest.skip("Qt's xcb plugin loads here")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env["DISPLAY"] = ":99"
    r = subprocess.run(sdplan_cmd(), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == f"sdplan gui: {expected}"


def test_governor_follows_the_load_between_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[int] = []
    start = th.ThreadChoice(2, 2, 0, 0.0, "the 2 CPUs")
    samples = iter([_sample([0, 0], [0, 0], 0.0, 0.0), _sample([100, 50], [100, 100], 0.5, 1.0),
                    _sample([150, 150], [200, 200], 1.5, 2.0), _sample([], [], 0.0, 0.0)])
    monkeypatch.setattr(th.CpuSample, "now", classmethod(lambda cls, cpus=None: next(samples)))
    clock = iter([1.0, 2.0])
    gov = th.ThreadGovernor(start, applied.append, interval=0.5)
    import types

    monkeypatch.setattr(th, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    # 1.5 cores busy, 0.5 of them ours -> 1.0 elsewhere -> 1 thread
    assert gov.check() is not None and applied == [1]
    # then 1.0 busy, all ours -> free again -> 2 threads
    assert gov.check() is not None and applied == [1, 2]
    one = th.ThreadGovernor(th.ThreadChoice(1, 2, 1, None, "-t 1"), applied.append)
    assert one.check() is None  # -t 1: nothing to lower, never raised


def test_cpu_feature_advice_names_the_cmake_switches() -> None:
    from sdplan.core.runtime.devices import missing_cpu_features_advice

    msg = missing_cpu_features_advice(["AVX2", "F16C"])
    assert "-C cmake.define.GGML_AVX2=ON -C cmake.define.GGML_F16C=ON" in msg
    assert "GGML_NATIVE=ON" not in msg  # a native build measured slower (bench_ggml_build.py)
    assert "rebuild libggml-python from source" not in msg  # the old advice said only that


def test_devices_says_which_thread_count_and_why() -> None:
    r = sdplan("devices", "--json")
    import json

    th_info = json.loads(r.stdout)["features"]["cpu_threads"]
    assert th_info["default"] == len(os.sched_getaffinity(0)) == th_info["usable_cpus"]
    assert "CPU" in th_info["reason"]


def test_atomic_write_gives_the_modes_of_a_plain_new_file(tmp_path: Path) -> None:
    """A picture is readable by others as any new file would be (umask 022: 0o644; 077:
    0o600), not mkstemp's 0o600 always."""
    import os
    import stat

    from sdplan.core.pipelines.stages.outputs import atomic_write

    old = os.umask(0o022)
    try:
        a = atomic_write(tmp_path / "a.png", lambda p: p.write_bytes(b"x"))
        os.umask(0o077)
        b = atomic_write(tmp_path / "b.png", lambda p: p.write_bytes(b"x"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(a.stat().st_mode) == 0o644 and stat.S_IMODE(b.stat().st_mode) == 0o600
