"""Results: decoded images as pictures, and pictures as PNG files with their metadata.

The one place the command line and the desktop app turn a generation into files: both
write the same text chunks, ``parameters`` as sd-cli writes it and ``sdplan`` (model paths,
placement, hash), and read them back (:func:`read_generation`; :func:`read_result` for the
app's gallery and history).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sdplan.core.pipelines.stages.outputs import atomic_write
from sdplan.core.planning import bounded_json
from sdplan.core.planning.record_check import checked_record, checked_settings
from sdplan.core.sampling.finite import check_finite

if TYPE_CHECKING:  # the parameters reader loads where a picture is read back
    from sdplan.core.pipelines.stages.parameters import ImageParameters

#: How :func:`model_hash` is computed (written beside it as ``model_hash_method``).
MODEL_HASH_METHOD = "sha256(first 1 MiB + decimal file size)"


def image_to_uint8(img: np.ndarray) -> np.ndarray:
    """``(3, H, W)`` float in [-1, 1] -> ``(H, W, 3)`` uint8 (clamped, rounded).

    Raises:
        NonFiniteError: a NaN or infinity in ``img`` (it would be black).
    """
    check_finite(img, "decoded picture")
    x = np.clip((img + 1.0) * 127.5, 0, 255)
    return np.ascontiguousarray(np.round(x).astype(np.uint8).transpose(1, 2, 0))


def model_hash(path: str | Path) -> str:
    """Hex sha256 of the file's first MiB followed by its size as decimal ASCII
    (:data:`MODEL_HASH_METHOD`).

    Raises:
        OSError: the file cannot be read.
    """
    import hashlib  # OpenSSL's library: loaded where a hash is made, not by the engine process

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
    h.update(str(os.path.getsize(path)).encode())
    return h.hexdigest()


def picture_text(result: Mapping[str, Any], model_files: Mapping[str, Any]) -> dict[str, str]:
    """The PNG text chunks of an engine result (:func:`sdplan.core.pipelines.jobs.generate_job`):
    the settings that ran (``params``), the plan's strings (``plan``), the model flags
    (``model_flags``), where each module ran (``placements``) and the engine's ``timings``,
    through :func:`generation_text`. The one writer of a picture's record: the command line
    and the app call it alike.
    """
    return generation_text(result.get("params") or {}, model_files, result.get("plan") or {},
                           file_flags=list(result.get("model_flags") or ()),
                           ran=result.get("placements"), timings=result.get("timings"))


def generation_text(params: Mapping[str, Any], model_files: Mapping[str, Any],
                    placement: Mapping[str, Any] | None = None,
                    command: str | None = None,
                    file_flags: Sequence[str] | None = None,
                    ran: Mapping[str, Any] | None = None,
                    timings: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The PNG text chunks of one generation: ``parameters`` (sd-cli's layout, which sd-cli,
    Stable Diffusion web UI style tools and galleries read, with web UI's ``Model hash``;
    :func:`~sdplan.core.pipelines.stages.parameters.format_parameters`) and ``sdplan`` (JSON:
    the model files, the placement strings, the settings, the model's hashes and the sd-cli
    command, so sdplan restores a run). A picture is safe to share: every file it names
    (model files, the init picture, the mask, the LoRA folder, reference pictures, the
    command's) is named by its file name, never its folder (:func:`locate_model_files`
    finds them again).

    Args:
        params: the generation settings by sd-cli's request keys (``prompt``,
            ``negative_prompt``, ``seed``, ``steps``, ``sampling_method``, ``scheduler``,
            ``cfg_scale``, ``clip_skip``, ``width``, ``height``, ``guidance``, ``eta``,
            ``rng``, ...; ``upscale_model``/``upscale_repeats`` when upscaled;
            ``lora_model_dir``, ``lora_apply_mode``, ``loras``, ``init_img``, ``mask``,
            ``strength`` when given: recorded in ``sdplan`` only, as sd-cli writes none).
        model_files: model-file keys -> path or paths; ``model`` (else ``diffusion_model``)
            is hashed: ``model_hash`` (:func:`model_hash`, quick) and ``sha256`` of the whole
            file (:func:`~sdplan.core.modelfiles.library.file_sha256`, computed once and
            cached), whose first 10 hex digits are the ``Model hash``.
        placement: ``backend``, ``params_backend``, ``max_vram`` (and ``split_mode``,
            ``rpc_servers``) canonical strings.
        command: the equivalent sd-cli command line, when known (recorded as given).
        file_flags: the sd-cli flags the model files call for (``--prediction v``;
            :func:`~sdplan.core.planning.sdcli.model_file_flags`), when known: recorded as
            ``model_flags``, and without ``command`` the recorded command is written from the
            record (:func:`~sdplan.core.planning.sdcli.picture_command`, as the gallery does).
        ran: module -> where it ran (devices, ranges, residency), recorded as ``ran``.
        timings: the engine's seconds per phase, recorded as ``timings``.

    Returns:
        Text chunk name -> value.
    """
    from sdplan.core import __version__
    from sdplan.core.pipelines.stages.parameters import format_parameters

    paths = {k: [str(v)] if isinstance(v, (str, Path)) else [str(x) for x in v]
             for k, v in model_files.items() if v}
    files = {k: [_name(p) for p in v] for k, v in paths.items()}
    settings = {k: _named(k, v) for k, v in params.items() if k in _SETTINGS and v is not None}
    if not params.get("loras"):  # the folder and mode matter only to a run with LoRAs
        settings = {k: v for k, v in settings.items() if k not in ("lora_model_dir", "lora_apply_mode")}
    doc: dict[str, Any] = {"version": 1, "settings": settings, "model_files": files,
                           "placement": {k: v for k, v in (placement or {}).items() if v}}
    main = _first(paths.get("model")) or _first(paths.get("diffusion_model"))
    a1111 = None
    if main:
        try:
            doc["model_hash"] = model_hash(main)
            doc["model_hash_method"] = MODEL_HASH_METHOD
            from sdplan.core.modelfiles.library import file_sha256

            doc["sha256"] = file_sha256(main)
            a1111 = doc["sha256"][:10]
        except OSError:
            pass
    upscaler = _first(files.get("upscale_model")) or params.get("upscale_model")
    if upscaler:
        doc["upscale"] = {"model": _name(str(upscaler)),
                          "repeats": int(params.get("upscale_repeats") or 1)}
    doc.update(_inputs(params))
    if file_flags is not None:
        doc["model_flags"] = [str(f) for f in file_flags]
        if command is None:
            from sdplan.core.planning.sdcli import picture_command  # the sd-cli table: only here

            command = picture_command(files, doc["placement"], settings, doc["model_flags"])
    if command:
        doc["command"] = command
    if ran:
        doc["ran"] = {str(k): v for k, v in ran.items()}
    if timings:
        doc["timings"] = {str(k): round(float(v), 4) for k, v in timings.items() if isinstance(v, (int, float))}
    if params.get("architecture"):
        doc["architecture"] = str(params["architecture"])
    return {"parameters": format_parameters(settings, files, f"sdplan {__version__}",
                                            model_hash=a1111),
            "sdplan": json.dumps(doc, separators=(",", ":"))}


#: Settings that name a file or a folder: a picture records their names only.
PATH_SETTINGS = ("init_img", "mask", "lora_model_dir", "ref_images")


def _name(path: str) -> str:
    """A path's last component (either separator), as a shared picture names a file."""
    return os.path.basename(str(path).replace("\\", "/").rstrip("/")) or str(path)


def _named(key: str, value: Any) -> Any:
    """``value`` of setting ``key`` with any file or folder named by its last component."""
    if key not in PATH_SETTINGS or value in (None, ""):
        return value
    if isinstance(value, (list, tuple)):
        return [_name(str(v)) for v in value]
    return _name(str(value))


#: Settings a picture records (sd-cli's request keys).
_SETTINGS = ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale", "guidance",
             "seed", "sampling_method", "scheduler", "batch_count", "clip_skip", "eta",
             "sigmas", "flow_shift", "timestep_shift", "rng", "sampler_rng",
             "extra_sample_args", "vae_tile_size", "vae_tiling", "hires", "control_net", "control", "upscale_repeats", "slg_scale", "skip_layers",
             "skip_layer_start", "skip_layer_end", "lora_model_dir", "lora_apply_mode", "init_img",
             "mask", "strength", "ref_images", "taesd_decode", "force_sdxl_vae_conv_scale",
             "mode", "video_frames", "fps", "high_noise_steps", "high_noise_cfg_scale",
             "high_noise_sampling_method", "high_noise_eta", "moe_boundary")


def _inputs(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sdplan`` chunk's record of a generation's LoRAs (``loras``: ``[name, weight]``
    each, from the job's ``loras``; the prompt keeps their ``<lora:...>`` tags as sd-cli
    writes them). Nothing without LoRAs."""
    loras = params.get("loras") or []
    return {"loras": [[str(lo["name"]), float(lo["weight"])] for lo in loras]} if loras else {}


def _first(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        return str(value)
    values = list(value)
    return str(values[0]) if values else None


def save_png(image: np.ndarray, path: str | Path, text: Mapping[str, str] | None = None) -> Path:
    """Write uint8 ``(H, W, 3)`` ``image`` to ``path`` as PNG with ``text`` chunks (the
    folder is created), atomically (:func:`sdplan.core.pipelines.stages.outputs.atomic_write`: a
    failure leaves no partial file). Returns the path.

    Raises:
        OSError: the file cannot be written.
    """
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for k, v in (text or {}).items():
        info.add_text(k, v)
    pic = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    return atomic_write(path, lambda tmp: pic.save(tmp, format="PNG", pnginfo=info))


def read_png_text(path: str | Path) -> dict[str, str]:
    """The text chunks of a PNG file; ``tEXt`` chunks holding UTF-8 (as sd-cli writes them)
    are decoded as UTF-8.

    Raises:
        OSError: not a readable image (a FIFO or a device is refused without opening it).
    """
    from PIL import Image
    from sdplan.core.modelfiles.readers import special_file_kind

    kind = special_file_kind(path)
    if kind is not None:  # a FIFO would block the open until a writer comes
        raise OSError(f"not a regular file ({kind})")
    with Image.open(path) as im:
        out = {}
        for k, v in getattr(im, "text", {}).items():
            text = str(v)
            try:
                text = text.encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                pass
            out[str(k)] = text
        return out


def read_generation(path: str | Path) -> ImageParameters:
    """The generation a picture records: sdplan's ``sdplan`` chunk when present (full model
    paths, placement), completed from ``parameters`` (sd-cli's, sdplan's or A1111's layout;
    :func:`~sdplan.core.pipelines.stages.parameters.parse_parameters`). Empty settings when the
    picture records none.

    Raises:
        OSError: not a readable image (or video: its container's metadata,
            :func:`~sdplan.core.pipelines.stages.video.read_video_text`).
    """
    from sdplan.core.pipelines.stages.video import is_video_file, read_video_text

    return _generation(read_video_text(path) if is_video_file(path) else read_png_text(path))


def _generation(text: Mapping[str, str]) -> ImageParameters:
    from sdplan.core.pipelines.stages.parameters import ImageParameters, parse_parameters

    out = parse_parameters(text["parameters"]) if "parameters" in text else ImageParameters()
    raw = text.get("sdplan")
    if raw:
        try:
            doc = checked_record(bounded_json.loads(raw, "the sdplan record of a picture"))
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            out.settings.update(doc.get("settings") or {})
            out.model_files = {str(k): [str(p) for p in v]
                               for k, v in (doc.get("model_files") or {}).items()}
            out.placement = {str(k): str(v) for k, v in (doc.get("placement") or {}).items()}
            if isinstance(doc.get("model_flags"), list):
                out.model_flags = [str(f) for f in doc["model_flags"]]
            if isinstance(doc.get("architecture"), str):
                out.architecture = doc["architecture"]
            if isinstance(doc.get("sha256"), str):
                out.model_hash = doc["sha256"].lower()
            out.source = "sdplan"
    return out


def locate_model_files(files: Mapping[str, Sequence[str]], picture: str | Path, *,
                       sha256: str | None = None, cache: Any = None) -> dict[str, list[str]]:
    """The model files a picture names, found on this machine: a path that exists as it is;
    else a file of that name beside the picture, in the current folder, among the files
    shipped with sdplan (the demo model and its LoRAs), or among the files the model library
    has seen (``cache``: a
    :class:`~sdplan.core.modelfiles.library.LibraryCache`, default the user's), the one whose
    cached SHA-256 starts with ``sha256`` first when the picture records it. A key whose
    files are not all found is left out.

    Returns:
        Model-file key -> full paths.
    """
    from sdplan.core.modelfiles.library import LibraryCache
    from sdplan.core.pipelines.demo.model import demo_lora_dir, demo_model_path

    folders = [Path(picture).resolve().parent, Path.cwd(), demo_model_path().parent, demo_lora_dir()]
    known: list[str] | None = None
    out: dict[str, list[str]] = {}
    for key, names in files.items():
        found = []
        for name in names:
            if Path(name).is_file():
                found.append(str(Path(name).resolve()))
                continue
            base = _name(name)
            here = next((str(f / base) for f in folders if (f / base).is_file()), None)
            if here is None:
                if known is None:
                    lib = cache if cache is not None else LibraryCache()
                    hashes = getattr(lib, "hashes", {})
                    known = sorted(lib.entries, key=lambda p: not (sha256 and str(
                        (hashes.get(p) or [0, 0, ""])[2]).startswith(sha256)))
                here = next((p for p in known if _name(p) == base and Path(p).is_file()), None)
            if here is None:
                break
            found.append(here)
        if len(found) == len(names) and found:
            out[key] = found
    return out


def locate_inputs(settings: Mapping[str, Any], picture: str | Path) -> dict[str, Any]:
    """``settings`` with each file or folder a picture names by name only (``init_img``,
    ``mask``, ``lora_model_dir``, ``ref_images``) found beside the picture or in the current
    folder; a name found in neither stays as it is (the run then says it is missing)."""
    from sdplan.core.pipelines.demo.model import demo_lora_dir, demo_model_path

    folders = [Path(picture).resolve().parent, Path.cwd(), demo_model_path().parent, demo_lora_dir()]

    def find(name: str) -> str:
        if Path(name).exists():
            return name
        return next((str(f / name) for f in folders if (f / name).exists()), name)

    out = dict(settings)
    for key in PATH_SETTINGS:
        value = out.get(key)
        if isinstance(value, str) and value:
            out[key] = find(value)
        elif isinstance(value, (list, tuple)):
            out[key] = [find(str(v)) for v in value]
    return out


#: sd-cli's "parameters" text writes these on every picture, whether the run used them or not
#: (its defaults): a picture without sdplan's record says nothing when they hold them.
_WRITTEN_ALWAYS = {"guidance": 3.5, "rng": "cuda", "eta": float("inf")}
#: Settings a reused picture gives back (sd-cli's request keys).
#: The maps of several flags (tiling, hires fix, ControlNet) are recorded, not reused.
REUSED = tuple(k for k in _SETTINGS if k not in ("batch_count", "vae_tiling", "hires", "control_net", "control"))


def reusable_settings(gen: ImageParameters | ResultInfo, architecture: str | None = None) -> dict[str, Any]:
    """The settings a picture gives back to a new run (the command line's ``--from-image``
    and the app's "Reuse settings" alike): its generation settings by sd-cli's request keys,
    without what only the record's format wrote. A picture with sdplan's record
    (``architecture`` there, or given) keeps the options its family honours; one without
    (sd-cli's, A1111's) drops the values sd-cli's text writes on every picture (guidance 3.5,
    rng cuda, eta inf), which no run chose."""
    from sdplan.core.families import family_of
    from sdplan.core.families.options import GUIDANCE, RNG

    settings = {k: v for k, v in gen.settings.items() if k in REUSED and v not in (None, "")}
    arch = architecture or getattr(gen, "architecture", None)
    fam = family_of(arch) if arch else None
    if fam is None:
        return {k: v for k, v in settings.items() if _WRITTEN_ALWAYS.get(k, object()) != v}
    if not fam.honours(GUIDANCE):
        settings.pop("guidance", None)
    if not fam.honours(RNG) and settings.get("rng") == "cuda":
        settings.pop("rng")
    return settings


# --------------------------------------------------------------------------- the app's results

def result_text(params: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, str]:
    """The PNG text chunks of one result of an engine ``request`` (:func:`generation_text`):
    the result's ``params`` over the request's settings, with the request's model files and
    placement strings."""
    files = request.get("model_files") or {}
    merged = {**{k: v for k, v in request.items() if k != "model_files"},
              **{k: v for k, v in params.items() if v is not None}}
    placement = {k: str(request.get(k) or "") for k in ("backend", "params_backend", "max_vram")
                 if request.get(k)}
    return generation_text(merged, files, placement)


@dataclass
class ResultInfo:
    """What a result image says about itself (the app's gallery and history).

    Attributes:
        path: the image file.
        settings: generation settings by sd-cli's request keys (``prompt``, ``seed``,
            ``width``, ``height``, ``steps``, ``cfg_scale``, ``sampling_method``...).
        model: the model's file name (empty when unknown).
        model_files: sd-cli model-file key -> paths, when the image records them.
        placement: ``backend`` / ``params_backend`` / ``max_vram`` (and ``split_mode``,
            ``rpc_servers``) strings it ran with.
        text: every text chunk as read.
        model_flags: the sd-cli flags its model files call for (``--prediction v``), as
            recorded; empty when none or not recorded.
        architecture: the architecture that ran (``sd1``, ``flux-dev``...), when recorded.
    """

    path: str
    settings: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    model_files: dict[str, list[str]] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    model_flags: list[str] = field(default_factory=list)
    architecture: str | None = None

    @property
    def prompt(self) -> str:
        return str(self.settings.get("prompt") or "")

    def matches(self, query: str) -> bool:
        """True when every word of ``query`` is in the prompt, negative prompt or model
        files (case-insensitive)."""
        hay = " ".join((self.prompt, str(self.settings.get("negative_prompt") or ""),
                        self.model, *(p for v in self.model_files.values() for p in v))).lower()
        return all(w in hay for w in query.lower().split())


#: The version key of a picture's index file (:func:`index_record`).
INDEX_KEY = "sdplan_index"


def index_record(params: Mapping[str, Any], model_files: Mapping[str, Any]) -> dict[str, Any]:
    """What the app keeps beside a picture it saved (``<name>.json``, the gallery's index of
    it, never shared with the picture): the settings that ran and the model files with their
    full paths, which the picture itself names by file name only."""
    files = {k: [str(v)] if isinstance(v, (str, Path)) else [str(x) for x in v]
             for k, v in model_files.items() if v}
    return {INDEX_KEY: 1, "settings": dict(params), "model_files": files}


def _index(path: str | Path) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The settings and full model paths of a picture's index file (an older app's file of
    settings alone too); empty when there is none or it cannot be read."""
    side = Path(path).with_suffix(".json")
    try:  # bounded: a hostile index beside a picture is one file set aside, never a crash
        data = bounded_json.read_json(side, what="picture index") if side.is_file() else None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return {}, {}
    if INDEX_KEY not in data:  # an older app's: the settings alone
        return {k: v for k, v in checked_settings(data).items()
                if k not in ("timings", "architecture", "model")}, {}
    settings = data.get("settings")
    files = data.get("model_files")
    return (dict(settings) if isinstance(settings, dict) else {},
            {str(k): [str(p) for p in v] for k, v in files.items() if isinstance(v, list)}
            if isinstance(files, dict) else {})


def _same_names(named: Any, full: Any) -> bool:
    a = named if isinstance(named, (list, tuple)) else [named]
    b = full if isinstance(full, (list, tuple)) else [full]
    return len(a) == len(b) and all(_name(str(x)) == _name(str(y)) for x, y in zip(a, b, strict=True))


def read_result(path: str | Path) -> ResultInfo:
    """What a result image records (:func:`read_generation`; a video: the same text from its
    container's metadata, :func:`~sdplan.core.pipelines.stages.video.read_video_text`), with
    the full paths of its files from the app's index beside it (:func:`index_record`) where
    they are the files the picture names; for an older app result without text chunks, the
    settings of that file.

    Raises:
        OSError: not a readable image or video.
    """
    from sdplan.core.pipelines.stages.video import is_video_file, read_video_text

    text = read_video_text(path) if is_video_file(path) else read_png_text(path)
    gen = _generation(text)
    settings = {k: v for k, v in gen.settings.items() if v not in (None, "")}
    kept, full = _index(path)
    if not settings:
        settings = {k: v for k, v in kept.items() if k != "timings"}
    for key in PATH_SETTINGS:  # the index's full path of a file the picture names
        if key in settings and kept.get(key) and _same_names(settings[key], kept[key]):
            settings[key] = kept[key]
    files = dict(gen.model_files)
    for key, paths in full.items():
        if key not in files or _same_names(files[key], paths):
            files[key] = paths
    main = (files.get("model") or files.get("diffusion_model") or [""])[0]
    return ResultInfo(str(path), settings, os.path.basename(main), files,
                      {k: v for k, v in gen.placement.items()
                       if k in ("backend", "params_backend", "max_vram", "split_mode", "rpc_servers") and v},
                      dict(text), list(gen.model_flags or ()), gen.architecture)
