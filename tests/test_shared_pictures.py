"""Pictures safe to share: every text chunk names files by their names (model files, the
init picture, the mask, the LoRA folder, reference pictures, the recorded command), never
their folders or the user's name; web UI's ``Model hash`` (the first 10 hex digits of the
model file's SHA-256, computed once and kept with the library's header cache); and the
files a picture names found again beside it, in the current folder or in the library."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from sdplan.core.modelfiles.library import LibraryCache, LibraryEntry, file_sha256
from sdplan.core.pipelines.stages.parameters import parse_parameters
from sdplan.core.pipelines.stages.results import (
    generation_text,
    locate_inputs,
    locate_model_files,
    read_generation,
    read_png_text,
    save_png,
)

FIXTURES = Path(__file__).parent / "fixtures"


def test_no_folder_of_the_user_in_any_chunk_and_the_model_hash(tmp_path: Path) -> None:
    home = tmp_path / "home" / "alice"
    models = home / "models"
    models.mkdir(parents=True)
    model = models / "flux1-dev-Q8_0.gguf"
    model.write_bytes(os.urandom(3 << 20))
    (home / "loras").mkdir()
    params = {"prompt": "a cat <lora:ink:0.8>", "steps": 4, "seed": 1, "width": 64, "height": 64,
              "init_img": str(home / "start.png"), "mask": str(home / "mask.png"),
              "strength": 0.5, "lora_model_dir": str(home / "loras"), "lora_apply_mode": "auto",
              "ref_images": [str(home / "ref1.png"), "C:\\Users\\alice\\ref2.png"],
              "loras": [{"name": "ink", "weight": 0.8}]}
    files = {"diffusion_model": [str(model)], "vae": [str(models / "ae.safetensors")],
             "t5xxl": [str(models / "t5xxl_fp16.safetensors")]}
    text = generation_text(params, files, {"backend": "CUDA0"}, file_flags=[])
    everything = "".join(text.values())
    assert "alice" not in everything and str(tmp_path) not in everything
    doc = json.loads(text["sdplan"])
    assert doc["model_files"] == {"diffusion_model": ["flux1-dev-Q8_0.gguf"], "vae": ["ae.safetensors"],
                                  "t5xxl": ["t5xxl_fp16.safetensors"]}
    s = doc["settings"]
    assert (s["init_img"], s["mask"], s["lora_model_dir"], s["ref_images"]) == (
        "start.png", "mask.png", "loras", ["ref1.png", "ref2.png"])
    assert "--diffusion-model flux1-dev-Q8_0.gguf" in doc["command"]
    assert "--init-img start.png" in doc["command"]
    full = hashlib.sha256(model.read_bytes()).hexdigest()
    assert doc["sha256"] == full
    assert f", Model hash: {full[:10]}, Model: , " in text["parameters"]
    assert parse_parameters(text["parameters"]).model_hash == full[:10]
    pic = save_png(np.zeros((4, 4, 3), np.uint8), tmp_path / "p.png", text)
    assert read_generation(pic).model_hash == full


def test_the_hash_is_read_once_and_kept_with_the_library_cache(tmp_path: Path) -> None:
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"a" * 5000)
    cache_file = tmp_path / "cache" / "library-v1.json"
    first = file_sha256(model, LibraryCache(cache_file))
    assert first == hashlib.sha256(b"a" * 5000).hexdigest()
    saved = json.loads(cache_file.read_text())
    assert saved["sha256"][str(model.resolve())] == [5000, model.stat().st_mtime_ns, first]
    # the same size and modification time: the cached hash, the file is not read again
    st = model.stat()
    model.write_bytes(b"b" * 5000)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_sha256(model, LibraryCache(cache_file)) == first
    # a changed file (a new modification time) is read again
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert file_sha256(model, LibraryCache(cache_file)) == hashlib.sha256(b"b" * 5000).hexdigest()
    # hashes outlive a cache written by other code (its entries are dropped, not its hashes)
    data = json.loads(cache_file.read_text())
    data["stamp"] = "older code"
    cache_file.write_text(json.dumps(data))
    again = LibraryCache(cache_file)
    assert again.entries == {} and str(model.resolve()) in again.hashes


def test_files_a_picture_names_are_found_beside_it_here_and_in_the_library(tmp_path, monkeypatch):
    pics, work, lib = tmp_path / "pics", tmp_path / "work", tmp_path / "lib"
    for d in (pics, work, lib / "a", lib / "b"):
        d.mkdir(parents=True)
    (pics / "vae.safetensors").write_bytes(b"v")
    (work / "te.safetensors").write_bytes(b"t")
    one, two = lib / "a" / "model.gguf", lib / "b" / "model.gguf"
    one.write_bytes(b"1")
    two.write_bytes(b"2")
    cache = LibraryCache(tmp_path / "c.json")
    for p in (one, two):
        cache.put(LibraryEntry(str(p), 1, p.stat().st_mtime_ns, "diffusion"))
    want = cache.sha256(two)  # the picture records the second one's hash
    monkeypatch.chdir(work)
    named = {"diffusion_model": ["model.gguf"], "vae": ["vae.safetensors"],
             "t5xxl": ["te.safetensors"], "clip_l": ["nowhere.safetensors"]}
    found = locate_model_files(named, pics / "x.png", sha256=want[:10], cache=cache)
    assert found == {"diffusion_model": [str(two)], "vae": [str(pics / "vae.safetensors")],
                     "t5xxl": [str(work / "te.safetensors")]}
    assert locate_model_files(named, pics / "x.png", cache=cache)["diffusion_model"] == [str(one)]
    (pics / "start.png").write_bytes(b"p")
    got = locate_inputs({"init_img": "start.png", "mask": "gone.png", "seed": 3}, pics / "x.png")
    assert got == {"init_img": str(pics / "start.png"), "mask": "gone.png", "seed": 3}


def test_an_old_picture_with_full_paths_still_reads(tmp_path: Path) -> None:
    """Pictures written before file names only: their paths are used where they exist."""
    model = FIXTURES / "sd1_tiny.safetensors"
    doc = {"version": 1, "settings": {"prompt": "x"}, "model_files": {"model": [str(model)]},
           "placement": {}}
    pic = save_png(np.zeros((4, 4, 3), np.uint8), tmp_path / "old.png",
                   {"sdplan": json.dumps(doc)})
    got = read_generation(pic)
    assert locate_model_files(got.model_files, pic, cache=LibraryCache(tmp_path / "c.json")) == {
        "model": [str(model.resolve())]}
    assert read_png_text(pic)["sdplan"] == json.dumps(doc)
