"""``sdplan serve``: the request readers, limits and queue, then a live server on loopback
with real clients (the ``openai`` package, ``webuiapi``: an A1111 API client), the demo model
and a fixture model (64 px, 2 steps)."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from rpc_util import sdplan_cmd
from sdplan.core.errors import InvalidArgument, RequestRefused
from sdplan.core.pipelines.job_queue import JobQueue
from sdplan.core.server import apis
from sdplan.core.server.groups import parse_group
from sdplan.core.server.limits import ServerLimits
from sdplan.core.server.service import check_bind
from server_util import picture, serving

FIXTURES = Path(__file__).parent / "fixtures"
DEMO_PROMPT = "a red circle on a blue background"
STEPS_2 = '<sd_cpp_extra_args>{"sample_params":{"sample_steps":2}}</sd_cpp_extra_args>'


# ---------------------------------------------------------------------- readers, limits


def test_sdapi_names_become_sdcli_settings():
    p = apis.from_sdapi({"prompt": "a cat", "sampler_name": "Euler a", "scheduler": "Karras",
                         "batch_size": 2, "n_iter": 3, "steps": 4, "cfg_scale": 6.5, "seed": -1,
                         "width": 64, "height": 96, "override_settings": {"sd_model_checkpoint": "m.safetensors"}})
    assert p.settings == {"prompt": "a cat", "width": 64, "height": 96, "steps": 4, "cfg_scale": 6.5,
                          "seed": -1, "batch_count": 6, "sampling_method": "euler_a", "scheduler": "karras"}
    assert p.model == "m.safetensors"


def test_extra_args_and_native_schema():
    p = apis.from_openai({"prompt": "a dog " + '<sd_cpp_extra_args>{"sample_params":{"sample_steps":3,'
                          '"guidance":{"txt_cfg":4}},"seed":9}</sd_cpp_extra_args>', "size": "64x128", "n": 2})
    assert p.settings == {"prompt": "a dog", "width": 64, "height": 128, "batch_count": 2, "steps": 3,
                          "cfg_scale": 4.0, "seed": 9}
    native = apis.from_sdcpp({"prompt": "x", "lora": [{"path": "outline.safetensors", "multiplier": 0.5}],
                              "sample_params": {"custom_sigmas": [1.0, 0.5, 0.0]}})
    assert native.settings["prompt"] == "x <lora:outline:0.5>"
    assert native.settings["sigmas"] == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("body, code, where", [
    ({"prompt": ""}, "invalid_parameter", "prompt"),
    ({"prompt": "x", "steps": "many"}, "invalid_parameter", "steps"),
    ({"prompt": "x", "width": 0}, "invalid_parameter", "width"),
    ({"prompt": "x", "cfg_scale": float("nan")}, "invalid_parameter", "cfg_scale"),
    ({"prompt": "x <sd_cpp_extra_args>{no</sd_cpp_extra_args>"}, "invalid_json", "sd_cpp_extra_args"),
    ({"prompt": "x", "init_images": ["@@"]}, "invalid_image", "init_images[0]"),
])
def test_bad_fields_are_named(body, code, where):
    with pytest.raises(RequestRefused) as e:
        apis.from_sdapi(body, img2img="init_images" in body)
    assert e.value.code == code and str(e.value).startswith(where)


def test_openai_size_and_pictures():
    assert apis.parse_size("512x768") == (512, 768)
    with pytest.raises(RequestRefused, match="WIDTHxHEIGHT"):
        apis.parse_size("big")
    data = base64.b64encode(b"\x89PNG").decode()
    assert apis.decode_picture("data:image/png;base64," + data, "x") == b"\x89PNG"
    with pytest.raises(RequestRefused, match="response_format"):
        apis.from_openai({"prompt": "x", "response_format": "url"})


def test_limits_refuse_before_work():
    lim = ServerLimits(max_body_bytes=100, max_pixels=64 * 64, max_batch=2, max_steps=10)
    with pytest.raises(RequestRefused) as e:
        lim.check_body(101)
    assert (e.value.code, e.value.status) == ("too_large", 413)

    class Req:
        width, height, batch_count, steps, prompt, negative_prompt = 128, 64, 1, 4, "x", ""
    with pytest.raises(RequestRefused, match="128x64 px"):
        lim.check_request(Req)
    Req.width, Req.steps = 64, 11
    with pytest.raises(RequestRefused, match="11 steps"):
        lim.check_request(Req)


def test_bind_and_groups():
    check_bind("127.0.0.1", False)
    check_bind("::1", False)
    with pytest.raises(InvalidArgument, match="--allow-remote"):
        check_bind("0.0.0.0", False)
    check_bind("0.0.0.0", True)
    assert parse_group("rpc:127.0.0.1:5000,127.0.0.1:5001", 1).rpc_servers == ("127.0.0.1:5000", "127.0.0.1:5001")
    assert dict(parse_group("local:CUDA_VISIBLE_DEVICES=1", 0).env) == {"CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(InvalidArgument, match="--device-group"):
        parse_group("gpu0", 0)


def test_queue_file_keeps_server_jobs_for_the_app(tmp_path):
    q = JobQueue(tmp_path / "q.json")
    job = q.add({"prompt": "a", "steps": 2}, origin="server", job_id="job_1")
    job.group, job.predicted = "g1", 1.5
    q.save()
    read = JobQueue.read(tmp_path / "q.json")
    assert [(j.id, j.origin, j.group, j.predicted) for j in read] == [("job_1", "server", "g1", 1.5)]
    assert JobQueue.read(tmp_path / "none.json") == []


# ---------------------------------------------------------------------- live: the demo


@pytest.fixture(scope="module")
def demo():
    with serving("--demo", "-t", "1", "--max-queue", "8") as server:
        yield server


def _cli_picture(tmp_path, *args):
    out = tmp_path / "cli.png"
    subprocess.run(sdplan_cmd("generate", *args, "-o", str(out), "-t", "1"), check=True,
                   capture_output=True, timeout=120)
    return picture(out.read_bytes())


@pytest.mark.slow
def test_a1111_client_gets_the_cli_picture_and_the_model_stays_loaded(demo, tmp_path):
    import webuiapi

    api = webuiapi.WebUIApi(host="127.0.0.1", port=demo.port, sampler="Euler", steps=2)
    runs = []
    for _ in range(2):
        r = api.txt2img(prompt=DEMO_PROMPT, width=64, height=64, cfg_scale=5, seed=7)
        runs.append(r)
    first, second = (r.info for r in runs)
    assert runs[0].image.size == (64, 64)
    assert first["loaded"] is True and second["loaded"] is False
    print(f"\nfirst request (loads the model): {first['timings']['total']:.3f} s in the engine; "
          f"second (loaded): {second['timings']['total']:.3f} s")
    served = np.asarray(runs[1].image.convert("RGB"))
    cli = _cli_picture(tmp_path, "--demo", "-p", DEMO_PROMPT, "-W", "64", "-H", "64", "--steps", "2",
                       "--cfg-scale", "5", "--sampling-method", "euler", "-s", "7")
    assert np.abs(served.astype(int) - cli.astype(int)).max() <= 1
    assert np.array_equal(np.asarray(runs[0].image.convert("RGB")), served)


@pytest.mark.slow
def test_openai_client_generates_and_edits(demo):
    import openai

    client = openai.OpenAI(base_url=demo.url + "/v1", api_key="unused", max_retries=0)
    res = client.images.generate(prompt=DEMO_PROMPT + " " + STEPS_2, size="64x64", n=2)
    pics = [picture(d.b64_json) for d in res.data]
    assert [p.shape for p in pics] == [(64, 64, 3)] * 2
    assert not np.array_equal(pics[0], pics[1])  # a batch: two seeds
    buf = io.BytesIO()
    from PIL import Image

    Image.fromarray(pics[0]).save(buf, format="PNG")
    edit = client.images.edit(image=("in.png", buf.getvalue(), "image/png"),
                              prompt="a green square on a yellow background " + STEPS_2, size="64x64")
    assert picture(edit.data[0].b64_json).shape == (64, 64, 3)
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(prompt="x " + '<sd_cpp_extra_args>{"sample_params":{"sample_method":"foo"}}'
                               "</sd_cpp_extra_args>", size="64x64")
    assert e.value.code == "invalid_parameter"
    assert "--sampling-method foo: SD 1.x does not run it" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.images.generate(prompt="x", model="no-such-model", size="64x64")


@pytest.mark.slow
def test_errors_are_json_with_a_code(demo):
    status, body = demo.post("/sdapi/v1/txt2img", b"{bad")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = demo.post("/sdapi/v1/txt2img", {"prompt": "x", "width": 65, "height": 64})
    assert status == 400 and "multiples of 32" in body["error"]["message"]
    status, body = demo.post("/sdapi/v1/txt2img", {"prompt": "x", "scheduler": "flux"})
    assert status == 400 and body["error"]["message"].startswith("--scheduler flux: SD 1.x does not run it")
    status, body = demo.post("/sdapi/v1/txt2img", {"prompt": "x", "steps": 151})
    assert (status, body["error"]["code"]) == (400, "too_large")
    status, body = demo.get("/nowhere")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body = demo.request("GET", "/sdapi/v1/txt2img", None)
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")
    # a body over the limit: refused from its Content-Length, before it is read
    with socket.create_connection(("127.0.0.1", demo.port), timeout=10) as s:
        s.sendall(b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 999999999\r\n\r\n{")
        head = ""
        while '"too_large"' not in head and (chunk := s.recv(4096)):
            head += chunk.decode()
    assert head.startswith("HTTP/1.1 413") and '"too_large"' in head


@pytest.mark.slow
def test_a1111_hires_settings_are_honoured_or_refused(demo):
    body = {"prompt": DEMO_PROMPT, "width": 128, "height": 128, "steps": 2, "seed": 5, "enable_hr": True,
            "hr_scale": 1.5, "hr_second_pass_steps": 2, "denoising_strength": 0.5, "hr_upscaler": "Latent (nearest)"}
    status, res = demo.post("/sdapi/v1/txt2img", body)
    assert status == 200, res
    assert picture(res["images"][0]).shape == (192, 192, 3)
    hires = json.loads(res["info"])["params"]["hires"]
    assert (hires["scale"], hires["steps"], hires["denoising_strength"], hires["upscaler"]) == \
        (1.5, 2, 0.5, "Latent (nearest)")
    for extra, field in (({"hr_upscaler": "R-ESRGAN 4x+"}, "hr_upscaler"), ({"hr_scale": float("nan")}, "hr_scale"),
                         ({"hr_sampler_name": "DPM++ 2M"}, "hr_sampler_name"), ({"cfg_scale": 1e9}, "cfg_scale"),
                         ({"seed": 2**64}, "seed"), ({"enable_hr": False, "hr_scale": float("inf")}, "hr_scale")):
        status, err = demo.post("/sdapi/v1/txt2img", json.dumps({**body, **extra}).encode())
        assert (status, err["error"]["code"]) == (400, "invalid_parameter"), err
        assert err["error"]["message"].startswith(field + ":"), err
    status, err = demo.post("/sdapi/v1/img2img", {"prompt": "x", "init_images": [base64.b64encode(b"junk").decode()]})
    assert (status, err["error"]["code"]) == (400, "invalid_image")
    assert err["error"]["message"].startswith("init_images[0]: not a picture") and "object at" not in err["error"]["message"]


@pytest.mark.slow
def test_native_jobs_and_cancel(demo):
    status, sub = demo.post("/sdcpp/v1/img_gen", {"prompt": DEMO_PROMPT, "width": 64, "height": 64,
                                                  "sample_params": {"sample_steps": 2}})
    assert status == 202 and sub["poll_url"] == f"/sdcpp/v1/jobs/{sub['id']}"
    deadline = time.monotonic() + 60
    while (job := demo.get(sub["poll_url"])[1])["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job["status"] == "completed" and job["device_group"] == "g0"
    assert picture(job["result"]["images"][0]["b64_json"]).shape == (64, 64, 3)
    assert demo.post(f"{sub['poll_url']}/cancel", {})[0] == 409
    assert demo.get("/sdcpp/v1/jobs/job_nope")[0] == 404
    caps = demo.get("/sdcpp/v1/capabilities")[1]
    assert caps["features"]["init_image"] is True and caps["features"]["ref_images"] is False
    assert caps["limits"]["max_queue_size"] == 8


@pytest.mark.slow
def test_disconnect_cancels_the_job(demo):
    body = json.dumps({"prompt": DEMO_PROMPT, "width": 128, "height": 128, "steps": 150}).encode()
    with socket.create_connection(("127.0.0.1", demo.port), timeout=10) as s:
        s.sendall(b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 30
        while not [j for j in demo.get("/sdplan/v1/queue")[1]["jobs"] if j["state"] == "running"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    deadline = time.monotonic() + 30
    while True:
        jobs = demo.get("/sdplan/v1/queue")[1]["jobs"]
        last = jobs[-1]
        if last["state"] != "running":
            break
        assert time.monotonic() < deadline, last
        time.sleep(0.05)
    assert last["state"] == "cancelled" and last["origin"] == "server"
    assert last["steps_done"] < 150


@pytest.mark.slow
def test_metrics_match_the_estimate(demo):
    status, _ = demo.post("/sdapi/v1/txt2img", {"prompt": DEMO_PROMPT, "width": 64, "height": 64, "steps": 2})
    assert status == 200
    m = demo.metrics()
    g = m["groups"][0]
    assert g["model"] == "sdplan-demo-shapes" and g["plan"]["backend"] == "CPU"
    peak = g["measured_peak"]["CPU"]
    est = g["estimate"]["devices"]["CPU"]["total"]
    print(f"\nCPU: estimate {est} bytes, measured peak {peak} bytes ({est / peak:.3f})")
    assert abs(est - peak) <= 0.10 * peak
    mods = g["memory"]
    assert set(mods) >= {"diffusion", "te", "vae"}
    weights = sum(d["cache"]["weights"] for mm in mods.values() for d in mm.values())
    assert weights == m["model_memory"]["total_bytes"] == m["model_memory"]["ram_bytes"]
    assert m["processing"]["total_completed"] >= 1


# ---------------------------------------------------------------------- live: a fixture model, swaps, a key


@pytest.mark.slow
def test_model_swap_frees_the_previous_model_and_needs_the_key(tmp_path):
    import openai
    import webuiapi

    lib = tmp_path / "models"
    lib.mkdir()
    os.symlink(FIXTURES / "sd1_tiny.safetensors", lib / "sd1_tiny.safetensors")
    from pth_writer import compact_weights
    from safetensors.numpy import save_file

    save_file(compact_weights(feat=8, n_conv=2), str(lib / "compact_x2.safetensors"))
    with serving("--demo", "-t", "1", "--models-dir", str(lib), "--api-key", "k3y") as srv:
        assert srv.get("/v1/models")[0] == 401
        assert srv.get("/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
        assert srv.get("/health")[0] == 200
        srv.auth = {"X-API-Key": "k3y"}
        # the library's ESRGAN is a hires upscaler A1111's clients can name
        ups = srv.get("/sdapi/v1/upscalers")[1]
        assert [u["name"] for u in ups] == ["None", "Lanczos", "Nearest", "compact_x2"]
        status, res = srv.post("/sdapi/v1/txt2img", {"prompt": DEMO_PROMPT, "width": 64, "height": 64, "steps": 2,
                                                     "enable_hr": True, "hr_upscaler": "compact_x2",
                                                     "hr_second_pass_steps": 2, "denoising_strength": 0.5})
        assert status == 200, res
        assert picture(res["images"][0]).shape == (128, 128, 3)
        hires = json.loads(res["info"])["params"]["hires"]
        assert (hires["upscaler"], hires["upscalers_dir"]) == ("compact_x2", str(lib))
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k3y", max_retries=0)
        assert {m.id for m in client.models.list()} == {"sdplan-demo-shapes", "sd1_tiny"}
        client.images.generate(prompt=DEMO_PROMPT + " " + STEPS_2, size="64x64")
        demo_held = srv.metrics()["model_memory"]["total_bytes"]
        res = client.images.generate(prompt="a cat " + STEPS_2, size="64x64", model="sd1_tiny")
        assert picture(res.data[0].b64_json).shape == (64, 64, 3)
        last = srv.metrics()["groups"][0]["last_job"]
        assert last["model"] == "sd1_tiny" and last["loaded"] is True
        print(f"\nswap: the demo's buffers held {last['released']['before']} bytes, "
              f"{last['released']['after']} after release")
        assert last["released"]["before"] >= demo_held > 0 and last["released"]["after"] == 0
        api = webuiapi.WebUIApi(host="127.0.0.1", port=srv.port, sampler="Euler", steps=2)
        api.set_auth("user", "k3y")
        r = api.txt2img(prompt="a cat", width=64, height=64, seed=3,
                        override_settings={"sd_model_checkpoint": "sd1_tiny"})
        assert r.image.size == (64, 64) and r.info["sd_model_name"] == "sd1_tiny"
        assert r.info["loaded"] is False


def _job(name: str = "m", steps: int = 2, batch: int = 1):
    from types import SimpleNamespace

    from sdplan.core.pipelines.request import GenerationRequest
    from sdplan.core.server.queue import ServerJob

    req = GenerationRequest.from_settings({"prompt": "a", "steps": steps, "batch_count": batch,
                                           "width": 64, "height": 64}, {"model": ["m.safetensors"]})
    return ServerJob("", None, SimpleNamespace(name=name), req, {})


def test_queue_order_limit_cancel_and_prediction():
    from sdplan.core.server.queue import ServerQueue

    q = ServerQueue(max_queue=2)
    a, b = q.submit(_job()), q.submit(_job(steps=4))
    with pytest.raises(RequestRefused) as e:
        q.submit(_job())
    assert (e.value.code, e.value.status) == ("queue_full", 429)
    assert (q.position(a), q.position(b)) == (0, 1)
    assert q.predicted(a) is None  # nothing measured yet: no prediction
    assert q.cancel(b.id) == "cancelled" and b.done.is_set()
    with pytest.raises(RequestRefused) as e:
        q.cancel(b.id)
    assert e.value.status == 409
    taken = q.take("g0", timeout=0)
    assert taken is a and a.state == "running" and q.record.get(a.id).group == "g0"
    q.time_model.observe(a, 1.0, loaded_now=True)  # the first run loads: no rate from it
    q.finish(a, "done")
    q.time_model.observe(a, 0.5, loaded_now=False)  # 2 steps in 0.5 s
    c = q.submit(_job(steps=8, batch=2))
    assert q.predicted(c) == pytest.approx(16 * 0.25)  # the model is not loaded on a group
    assert q.counts() == {"queued": 1, "running": 0, "done": 1, "failed": 0, "cancelled": 1}
    q.close()
    assert c.state == "cancelled" and q.take("g0", timeout=0) is None
