"""``sdplan serve``'s request readers: A1111's and sd-server's hires fields become sdplan's
hires request or a refusal naming the field, the command line's limits apply to every
request, and no refusal shows a NaN error or an object's repr. Pure Python: no server."""

from __future__ import annotations

import pytest
from sdplan.core.errors import RequestRefused
from sdplan.core.pipelines.limits import SEED_RANGE
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.request_parts import HiresFix
from sdplan.core.server import apis
from sdplan.core.server.limits import ServerLimits
from sdplan.core.server.pictures import write_pictures

FILES = {"model": ["m.safetensors"]}


def _refused(call, *args, **kwargs) -> RequestRefused:
    with pytest.raises(RequestRefused) as e:
        call(*args, **kwargs)
    assert e.value.status == 400
    return e.value


def _resolved(body: dict, width: int = 128, height: int = 128, upscalers: dict | None = None) -> HiresFix:
    """The hires fix a txt2img body asks for once the server resolves it."""
    parsed = apis.from_sdapi({"prompt": "x", **body})
    settings = dict(parsed.settings)
    apis.resolve_hires(parsed, settings, width, height, upscalers or {})
    assert parsed.settings.get("hires") == settings.get("hires")  # the engine runs what was checked
    return GenerationRequest.from_settings(settings, FILES).hires


# ---------------------------------------------------------------------- A1111's hires fields


def test_hr_scale_steps_strength_and_latent_upscaler_are_honoured():
    fix = _resolved({"width": 128, "height": 128, "enable_hr": True, "hr_scale": 1.5,
                     "hr_upscaler": "latent (bicubic)", "hr_second_pass_steps": 3, "denoising_strength": 0.4})
    assert (fix.enabled, fix.upscaler, fix.scale, fix.steps, fix.denoising_strength) == \
        (True, "Latent (bicubic)", 1.5, 3, 0.4)
    assert fix.in_latent and fix.target(128, 128, 8) == (192, 192)
    # sd-server's spelling of the second pass's steps
    assert _resolved({"enable_hr": True, "hr_steps": 5}).steps == 5
    # nothing given: sd-cli's defaults (Latent, 2x, the first pass's steps, 0.7)
    assert _resolved({"enable_hr": True}) == HiresFix(True)


def test_hires_fields_without_enable_hr_change_nothing():
    # A1111 reads them only with enable_hr; webuiapi sends them with every txt2img
    p = apis.from_sdapi({"prompt": "x", "enable_hr": False, "hr_scale": 1.5, "denoising_strength": 0.7,
                         "hr_upscaler": "Latent", "hr_prompt": "", "hr_sampler_name": None})
    assert "hires" not in p.settings and "strength" not in p.settings


def test_webuiapi_defaults_with_enable_hr_are_taken():
    body = {"enable_hr": True, "denoising_strength": 0.7, "hr_scale": 2, "hr_upscaler": "Latent",
            "hr_second_pass_steps": 0, "hr_resize_x": 0, "hr_resize_y": 0, "hr_checkpoint_name": None,
            "hr_sampler_name": None, "hr_scheduler": None, "hr_prompt": "", "hr_negative_prompt": ""}
    assert _resolved(body) == HiresFix(True, "Latent", 2.0, 0, 0, 0, 0.7)


def test_hr_resize_keeps_the_aspect_ratio_as_a1111():
    # one side: the other from the first pass's aspect ratio (A1111: x * height // width)
    fix = _resolved({"enable_hr": True, "hr_resize_x": 300}, width=128, height=64)
    assert (fix.width, fix.height) == (300, 150)
    fix = _resolved({"enable_hr": True, "hr_resize_y": 100}, width=128, height=64)
    assert (fix.width, fix.height) == (200, 100)
    fix = _resolved({"enable_hr": True, "hr_resize_x": 256, "hr_resize_y": 128, "hr_scale": 3}, width=128, height=64)
    assert (fix.width, fix.height) == (256, 128) and fix.target(128, 64, 8) == (256, 128)
    e = _refused(_resolved, {"enable_hr": True, "hr_resize_x": 256, "hr_resize_y": 256}, width=128, height=64)
    assert str(e).startswith("hr_resize_x/hr_resize_y: 256x256 has another aspect ratio")
    e = _refused(_resolved, {"enable_hr": True, "hr_resize_x": 1}, width=128, height=64)
    assert str(e).startswith("hr_resize_x/hr_resize_y: 1x0 leaves no picture")


def test_an_esrgan_name_is_a_library_model_or_refused(tmp_path):
    model = tmp_path / "compact_x2.safetensors"
    fix = _resolved({"enable_hr": True, "hr_upscaler": "compact_x2"}, upscalers={"compact_x2": str(model)})
    assert (fix.upscaler, fix.upscalers_dir, fix.is_model) == ("compact_x2", str(tmp_path), True)
    # by file name too
    fix = _resolved({"enable_hr": True, "hr_upscaler": "compact_x2.safetensors"},
                    upscalers={"compact_x2": str(model)})
    assert fix.upscaler == "compact_x2"
    e = _refused(_resolved, {"enable_hr": True, "hr_upscaler": "R-ESRGAN 4x+"}, upscalers={"compact_x2": str(model)})
    assert e.code == "invalid_parameter"
    assert str(e).startswith("hr_upscaler: 'R-ESRGAN 4x+' is neither one of sdplan's upscalers")
    assert "compact_x2" in str(e)


@pytest.mark.parametrize("body, field", [
    ({"hr_upscaler": "None"}, "hr_upscaler"),
    ({"hr_sampler_name": "DPM++ 2M"}, "hr_sampler_name"),
    ({"hr_checkpoint_name": "other.safetensors"}, "hr_checkpoint_name"),
    ({"hr_prompt": "a different prompt"}, "hr_prompt"),
    ({"hr_cfg": 3.0, "cfg_scale": 7.0}, "hr_cfg"),
    ({"hr_scale": 0}, "hr_scale"),
    ({"hr_scale": 17}, "hr_scale"),
    ({"hr_scale": float("nan")}, "hr_scale"),
    ({"hr_second_pass_steps": 1001}, "hr_second_pass_steps"),
    ({"hr_resize_x": 99999}, "hr_resize_x"),
    ({"denoising_strength": 0}, "denoising_strength"),
    ({"hr_second_pass_steps": 3, "hr_steps": 4}, "hr_steps"),
])
def test_what_sdplan_cannot_honour_is_refused_by_name(body, field):
    e = _refused(apis.from_sdapi, {"prompt": "x", "enable_hr": True, **body})
    assert e.code == "invalid_parameter" and str(e).startswith(field + ":"), str(e)


def test_the_same_second_pass_settings_are_taken():
    fix = _resolved({"enable_hr": True, "sampler_name": "Euler", "hr_sampler_name": "Euler",
                     "hr_scheduler": "Use same scheduler", "hr_checkpoint_name": "Use same checkpoint",
                     "cfg_scale": 5, "hr_cfg": 5})
    assert fix.enabled


def test_img2img_has_no_hires_fix():
    e = _refused(apis.from_sdapi, {"prompt": "x", "enable_hr": True, "init_images": ["AAAA"]}, img2img=True)
    assert str(e).startswith("enable_hr:")


# ---------------------------------------------------------------------- sd-server's hires object


def test_native_hires_object_reads_every_documented_field():
    p = apis.from_sdcpp({"prompt": "x", "hires": {
        "enabled": True, "upscaler": "Latent (nearest-exact)", "scale": 1.25, "target_width": 320,
        "target_height": 0, "steps": 4, "denoising_strength": 0.55, "custom_sigmas": [], "upscale_tile_size": 128}})
    fix = GenerationRequest.from_settings(p.settings, FILES).hires
    assert fix == HiresFix(True, "Latent (nearest-exact)", 1.25, 320, 0, 4, 0.55)
    assert fix.target(128, 128, 8) == (320, 320)  # sd-cli's semantics: one side alone is a square
    off = apis.from_sdcpp({"prompt": "x", "hires": {"enabled": False, "scale": 3}})
    assert "hires" not in off.settings
    nested = apis.from_openai({"prompt": 'x <sd_cpp_extra_args>{"hires":{"enabled":true,"scale":1.5}}'
                                         "</sd_cpp_extra_args>"})
    assert nested.settings["hires"] == {"enabled": True, "scale": 1.5}


@pytest.mark.parametrize("hires, field", [
    ({"enabled": True, "sharpness": 2}, "hires.sharpness"),
    ({"enabled": True, "custom_sigmas": [1.0, 0.5, 0.0]}, "hires.custom_sigmas"),
    ({"enabled": True, "upscale_tile_size": 64}, "hires.upscale_tile_size"),
    ({"enabled": True, "scale": 1e9}, "hires.scale"),
    ({"enabled": True, "denoising_strength": 1.5}, "hires.denoising_strength"),
    ({"enabled": True, "target_width": -8}, "hires.target_width"),
    ("on", "hires"),
])
def test_native_hires_refusals_name_the_field(hires, field):
    e = _refused(apis.from_sdcpp, {"prompt": "x", "hires": hires})
    assert str(e).startswith(field + ":"), str(e)


def test_native_upscaler_model_from_the_library(tmp_path):
    p = apis.from_sdcpp({"prompt": "x", "hires": {"enabled": True, "upscaler": "nope"}})
    e = _refused(apis.resolve_hires, p, dict(p.settings), 64, 64, {})
    assert str(e).startswith("hires.upscaler: 'nope' is neither")


# ---------------------------------------------------------------------- the command line's limits


@pytest.mark.parametrize("body, field", [
    ({"cfg_scale": 1e9}, "cfg_scale"),
    ({"seed": 1e30}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"seed": SEED_RANGE[0] - 1}, "seed"),
    ({"steps": 1001}, "steps"),
    ({"width": 8193}, "width"),
    ({"batch_size": 101}, "batch_size"),
    ({"batch_size": 20, "n_iter": 20}, "batch_size"),
    ({"n_iter": 0}, "n_iter"),
    ({"clip_skip": 49}, "clip_skip"),
    ({"prompt": 'x <sd_cpp_extra_args>{"seed": 18446744073709551616}</sd_cpp_extra_args>'}, "sd_cpp_extra_args.seed"),
    ({"prompt": 'x <sd_cpp_extra_args>{"sample_params":{"guidance":{"txt_cfg":1e9}}}</sd_cpp_extra_args>'},
     "sd_cpp_extra_args.sample_params.guidance.txt_cfg"),
])
def test_the_command_lines_limits_apply(body, field):
    e = _refused(apis.from_sdapi, {"prompt": "x", **body})
    assert e.code == "invalid_parameter" and str(e).startswith(field + ": must be"), str(e)


def test_openai_n_and_the_cli_share_the_limits():
    import argparse

    from sdplan.core.errors import InvalidArgument
    from sdplan.core.pipelines.limits import MAX_BATCH, check_generation

    e = _refused(apis.from_openai, {"prompt": "x", "n": MAX_BATCH + 1})
    assert str(e) == f"n: must be between 1 and {MAX_BATCH}, got {MAX_BATCH + 1}"
    with pytest.raises(InvalidArgument, match=r"^-s/--seed must be between"):
        check_generation(argparse.Namespace(seed=2**64))
    with pytest.raises(InvalidArgument, match=r"^--cfg-scale must be between -100 and 100, got 1e\+09"):
        check_generation(argparse.Namespace(cfg_scale=1e9))


def test_limit_edges_are_taken():
    p = apis.from_sdapi({"prompt": "x", "seed": SEED_RANGE[1], "cfg_scale": -100.0, "steps": 1000})
    assert (p.settings["seed"], p.settings["cfg_scale"], p.settings["steps"]) == (2**63 - 1, -100.0, 1000)
    native = apis.from_sdcpp({"prompt": "x", "seed": SEED_RANGE[0], "sample_params": {"guidance": {
        "txt_cfg": 100, "distilled_guidance": 100}}})
    assert (native.settings["seed"], native.settings["cfg_scale"], native.settings["guidance"]) == \
        (-(2**63), 100.0, 100.0)
    e = _refused(apis.from_sdcpp, {"prompt": "x", "sample_params": {"guidance": {"distilled_guidance": -1}}})
    assert str(e) == "sample_params.guidance.distilled_guidance: must be between 0 and 100, got -1"


def test_the_hires_pass_counts_against_the_servers_limits():
    lim = ServerLimits(max_pixels=256 * 256, max_side=256, max_steps=10)
    ok = GenerationRequest.from_settings({"prompt": "x", "width": 128, "height": 128, "steps": 4,
                                          "hires": {"enabled": True, "scale": 2}}, FILES)
    lim.check_request(ok)
    big = GenerationRequest.from_settings({"prompt": "x", "width": 128, "height": 128, "steps": 4,
                                           "hires": {"enabled": True, "scale": 3}}, FILES)
    with pytest.raises(RequestRefused, match="the hires pass's 384x384 px") as e:
        lim.check_request(big)
    assert e.value.code == "too_large"
    steps = GenerationRequest.from_settings({"prompt": "x", "width": 64, "height": 64, "steps": 4,
                                             "hires": {"enabled": True, "steps": 11}}, FILES)
    with pytest.raises(RequestRefused, match="11 hires steps"):
        lim.check_request(steps)


# ---------------------------------------------------------------------- NaN, pictures


def test_a_nan_anywhere_is_refused_by_name():
    e = _refused(apis.check_finite, {"prompt": "x", "enable_hr": False, "hr_scale": float("nan")})
    assert str(e) == "hr_scale: must be a finite number, got nan"
    e = _refused(apis.check_finite, {"lora": [{"path": "a", "multiplier": float("inf")}]})
    assert str(e).startswith("lora[0].multiplier:")
    apis.check_finite({"a": [1.0, {"b": 2}], "c": "NaN"})  # text is not a number


def test_a_bad_picture_is_named_by_its_field_without_a_repr(tmp_path):
    import base64

    p = apis.from_sdapi({"prompt": "x", "init_images": [base64.b64encode(b"not a picture").decode()]}, img2img=True)
    with pytest.raises(RequestRefused) as e:
        write_pictures(p.pictures, tmp_path, max_pixels=1 << 20, names=p.fields)
    assert e.value.code == "invalid_image" and str(e.value).startswith("init_images[0]: not a picture")
    assert "object at 0x" not in str(e.value) and "BytesIO" not in str(e.value)
    native = apis.from_sdcpp({"prompt": "x", "ref_images": [base64.b64encode(b"nope").decode()]})
    with pytest.raises(RequestRefused, match=r"^ref_images\[0\]: not a picture"):
        write_pictures(native.pictures, tmp_path, max_pixels=1 << 20, names=native.fields)
