"""core/session/modules.py without Qt: refusals per family from the registry, the ESRGAN
models of a folder, the late modules and their notes, the hires pass's size per family."""

from __future__ import annotations

from pathlib import Path

from sdplan.core.families import FAMILIES
from sdplan.core.families import options as o
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.session.modules import (
    esrgan_models,
    late_modules,
    module_summary,
    option_refusals,
    peak_size,
    with_late_modules,
)


def test_refusals_follow_the_registry() -> None:
    for fam in FAMILIES:
        got = option_refusals(fam.name)
        for group, option in (("hires", o.HIRES), ("control", o.CONTROL), ("vae_tiling", o.VAE_TILING)):
            assert (got[group] is None) == fam.honours(option), (fam.name, group)
            if got[group] is not None:
                assert got[group] == f"{o.OPTIONS[option]}: {fam.title} does not take it in sdplan"
    assert option_refusals(None) == {"hires": None, "vae_tiling": None, "control": None}  # runs as SD 1.x


def test_esrgan_models_of_a_folder(tmp_path: Path) -> None:
    for name in ("b.safetensors", "a.pth", "a.gguf", "Lanczos.pth", "notes.txt", "c.PT"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub.safetensors").mkdir()
    assert esrgan_models(tmp_path) == ["a", "b", "c"]
    assert esrgan_models(tmp_path / "missing") == [] and esrgan_models(None) == []


def test_late_modules_and_their_notes(tmp_path: Path) -> None:
    (tmp_path / "x2.pth").write_bytes(b"\0" * 1000)
    hires = {"hires": {"enabled": True, "upscaler": "x2", "upscalers_dir": str(tmp_path)}}
    assert late_modules(hires, {}) == {"upscaler": str(tmp_path / "x2.pth")}
    gone = {"hires": {"enabled": True, "upscaler": "x4", "upscalers_dir": str(tmp_path)}}
    assert late_modules(gone, {}) == {}  # the request's check names the missing model
    assert late_modules({**hires, "control_net": "cn.safetensors"}, {"upscale_model": ["u.pth"]}) == \
        {"upscaler": "u.pth", "controlnet": "cn.safetensors"}
    base = Profile({"diffusion": ModuleProfile((), 100)}, architecture="sd1")
    notes: list[str] = []
    prof = with_late_modules(base, {"upscaler": str(tmp_path / "x2.pth"),
                                    "controlnet": str(tmp_path / "none.safetensors")}, notes)
    assert prof is not None and prof.modules["upscaler"].total == 1000  # a .pth: its size
    assert "controlnet" not in prof.modules and len(notes) == 1 and notes[0].startswith("controlnet not counted")
    assert with_late_modules(None, {"upscaler": "u.pth"}) is None


def test_the_hires_pass_size_per_family() -> None:
    g = {"width": 200, "height": 120, "hires": {"enabled": True, "scale": 1.5}}
    assert peak_size(g, "sd1") == (320, 192)  # 300 x 180 up to 64 pixels
    assert peak_size(g, "flux-dev") == (304, 192)  # two latent pixels of 8: 16
    assert peak_size({**g, "hires": {"enabled": True, "upscaler": "None"}}, "sd1") == (200, 120)
    assert peak_size({"width": 64}, None) == (64, 1024)


def test_summary_of_relative_tiles_and_a_malformed_part() -> None:
    assert module_summary({"vae_tiling": {"enabled": True, "relative": [2, 3]}}) == ["VAE tiles 2×3 relative"]
    assert module_summary({"vae_tiling": "junk", "hires": {"enabled": True, "scale": "x"}}) == []
    assert module_summary({"hires": {"enabled": True, "width": 1024, "upscaler": "Lanczos"}}) == \
        ["hires 1024×1024 px Lanczos, denoise 0.7"]


def test_lifting_a_pasted_commands_module_flags() -> None:
    from sdplan.core.session.modules import lift_module_args

    got, kept = lift_module_args(["--hires", "--hires-scale", "1.5", "--weird", "--control-image", "c.png",
                                  "--canny", "--vae-tiling", "--vae-tile-size", "32x16", "--x", "1"],
                                 "cn.safetensors", "snapshot", 8)
    assert got["hires"]["scale"] == 1.5 and got["hires"]["enabled"]
    assert got["vae_tiling"]["tile_px"] == [256, 128]  # the snapshot's latent pixels, times 8
    assert (got["control_net"], got["control_image"], got["control_strength"], got["canny"]) == \
        ("cn.safetensors", "c.png", 0.9, True)
    assert kept == ["--weird", "--x", "1"]
    # without --hires (sd-cli ignores them) or a ControlNet file, and malformed values: kept as written
    got, kept = lift_module_args(["--hires-scale", "1.5", "--control-image", "c.png", "--vae-tile-size", "0x",
                                  "--hires", "--hires-steps", "x"], None, None, 8)
    assert got == {} and kept == ["--hires-scale", "1.5", "--control-image", "c.png", "--vae-tile-size", "0x",
                                  "--hires", "--hires-steps", "x"]


def test_a_pasted_tile_size_of_unknown_dialect_is_said() -> None:
    from sdplan.core.pipelines.demo.model import demo_model_path
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.session.session import Session

    s = Session(Inventory((Device("CPU", "host", "cpu", "CPU", 8 << 30, 8 << 30),)))
    pasted = s.import_command(f"sd-cli -m {demo_model_path()} -p x --vae-tiling --vae-tile-size 32")
    assert s.generation["vae_tiling"]["tile_px"] == [32, 32]
    assert pasted.notes == ["--vae-tile-size read in image pixels (the newest sd-cli's); the command does not "
                            "show whether it was written for the snapshot, whose tiles are latent pixels"]
    pasted = s.import_command(f"sd-cli -m {demo_model_path()} -p x --auto-fit --vae-tile-size 32")  # snapshot
    assert s.generation["vae_tiling"]["tile_px"] == [256, 256] and pasted.notes == []
