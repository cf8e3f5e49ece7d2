"""Model files -> modules, encoders, blocks, architecture and a planning profile.

sd-cli takes a model as several files (``-m`` full checkpoint, ``--diffusion-model``,
``--clip_l``, ``--t5xxl``, ``--vae``, ...). :func:`read_model_files` reads their headers
(:mod:`sdplan.core.modelfiles.readers`; no weights), puts every tensor into a module of
spec section 1 (and, for ``te``, into its encoder), finds the blocks of spec section 8 and
detects the architecture with the evidence for it. :func:`profile_from_model_flags` turns
that into the :class:`~sdplan.core.planning.profile.Profile` the planner takes, so ``sdplan plan -m
FILE`` and ``sdplan plan --profile FILE`` meet in one code path.

Layouts understood: the original single file (``model.diffusion_model.``,
``cond_stage_model.transformer.`` SD1 CLIP-L, ``cond_stage_model.model.`` SD2 OpenCLIP
ViT-H, ``conditioner.embedders.N.`` SDXL, ``first_stage_model.``, ``text_encoders.clip_l.``
/ ``clip_g.`` / ``t5xxl.`` SD3, ``control_model.``), standalone files (BFL Flux and SD3
DiTs without prefix, T5 ``encoder.block.N``, CLIP ``text_model.``, VAE ``encoder.`` /
``decoder.``, TAE family, ESRGAN, llama.cpp-named GGUF encoders) and diffusers folders
(``unet/``, ``transformer/``, ``text_encoder*/``, ``vae/``, ``controlnet/``).
"""

from __future__ import annotations

import logging
import re
import stat
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sdplan.core.errors import ModelFileError, PathError
from sdplan.core.families import DiffusionTensors, detect_family
from sdplan.core.families.wan import MARKER as WAN_MARKER
from sdplan.core.families.z_image import DIFFUSION_MARKERS
from sdplan.core.modelfiles.autofit_sizes import autofit_component_bytes, loaded_component_bytes
from sdplan.core.modelfiles.readers import (
    TensorFile,
    TensorInfo,
    read_header_once,
    refuse_special_file,
    stat_model_path,
)
from sdplan.core.modelfiles.te_read import is_llm_tail, unread_llm_tensors
from sdplan.core.modelfiles.unets import stage_bytes
from sdplan.core.planning import paths as safe_paths
from sdplan.core.planning.bounded_json import read_json
from sdplan.core.planning.modules import ENCODERS, FLAG_TARGETS, MODULES, SPLITTABLE
from sdplan.core.planning.profile import ModuleProfile, Profile

log = logging.getLogger(__name__)


#: Block path segments in the order their blocks execute (spec section 8).
BLOCK_SEGMENTS = ("transformer_blocks", "joint_blocks", "double_blocks", "single_blocks",
                  "blocks", "block", "layers")
_BLOCK_RE = re.compile(r"(?:^|\.)(" + "|".join(BLOCK_SEGMENTS) + r")\.(\d+)(?=\.|$)")
_UNET_RE = re.compile(  # UNet stages, and Chroma's approximator (runs before the blocks)
    r"(?:^|\.)(input_blocks|output_blocks|middle_block|down_blocks|up_blocks|mid_block"
    r"|distilled_guidance_layer)\.")
#: Names sd-cli converts to its own before its block rule sees them: diffusers Flux
#: single blocks, OpenCLIP ``transformer.resblocks.N`` (-> ``encoder.layers.N``) and
#: llama.cpp-named GGUF encoders (``blk.N``).
_SDCLI_RENAMES = (("single_transformer_blocks.", re.compile(r"(^|\.)single_transformer_blocks\."), r"\1single_blocks."),
                  ("resblocks.", re.compile(r"(^|\.)resblocks\."), r"\1layers."),
                  ("blk.", re.compile(r"(^|\.)blk\."), r"\1layers."))

# (prefix, module, encoder or None); the first matching prefix wins.
_PREFIXES: tuple[tuple[str, str, str | None], ...] = (
    ("model.diffusion_model.", "diffusion", None),
    ("cond_stage_model.transformer.", "te", "clip_l"),
    ("cond_stage_model.model.", "te", "clip_h"),
    ("text_encoders.clip_l.", "te", "clip_l"),
    ("text_encoders.clip_g.", "te", "clip_g"),
    ("text_encoders.t5xxl.", "te", "t5xxl"),
    ("text_encoders.llm.", "te", "llm"),
    ("first_stage_model.", "vae", None),
    ("control_model.", "controlnet", None),
)
_EMBEDDER_RE = re.compile(r"^conditioner\.embedders\.(\d+)\.(transformer|model)\.")
_DIFFUSERS_DIRS = {"unet": "diffusion", "transformer": "diffusion", "text_encoder": "te",
                   "text_encoder_2": "te", "text_encoder_3": "te", "vae": "vae",
                   "controlnet": "controlnet"}
#: An LLM encoder's vision tower (Qwen2.5-VL ``visual.``; Mistral-Small-3.x's Pixtral
#: ``vision_tower.`` and its ``multi_modal_projector.``), with or without ``text_encoders.llm.``.
_VISION_RE = re.compile(r"(?:^|\.)(?:visual|vision_tower|multi_modal_projector)\.")
_T5_RE = re.compile(r"(?:^|\.)(encoder\.block|enc\.blk)\.\d+\.")
_CLIP_BY_WIDTH = {768: "clip_l", 1024: "clip_h", 1280: "clip_g"}


@dataclass(frozen=True)
class ModelTensor:
    """One tensor of a model set, classified.

    Attributes:
        info: the header entry (name, dtype, shape, bytes, offset, file).
        module: module name of spec section 1.
        encoder: for ``te``: ``clip_l``/``clip_g``/``clip_h``/``t5xxl``/``llm``/``llm_vision`` (an
            LLM's vision tower); else None.
        role: ``main``, or ``preview`` for a ``--taesd`` tiny autoencoder.
        block: ``(segment rank, index)`` of its block (spec section 8) or None.
    """

    info: TensorInfo
    module: str
    encoder: str | None = None
    role: str = "main"
    block: tuple[int, int] | None = None


@dataclass(frozen=True)
class Architecture:
    """Detected model family with the evidence (tensor names and shapes) for it.

    ``family``: ``sd1``, ``sd2``, ``sdxl``, ``sd3``, ``flux``, ``chroma``, ``z_image``,
    ``flux2_klein``, ``flux2`` or ``unknown`` (loadable but not recognised, or no diffusion
    model); ``variant`` refines it (Flux dev / schnell, Chroma radiance, SD3 medium / large /
    3.5-medium, SDXL refiner, FLUX.2 klein 4b / 9b, FLUX.2 dev).
    """

    family: str
    variant: str | None = None
    evidence: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.family}-{self.variant}" if self.variant else self.family


@dataclass
class ModelSet:
    """Every tensor of the given model files, classified (see module docstring).

    Attributes:
        files: the headers read, in flag order.
        tensors: tensors sd-cli loads, classified.
        ignored: ``(tensor, reason)`` for tensors sd-cli does not load (EMA copies,
            training buffers, unknown names inside a full checkpoint).
        architecture: the detected architecture.
    """

    files: list[TensorFile]
    tensors: list[ModelTensor]
    ignored: list[tuple[TensorInfo, str]] = field(default_factory=list)
    architecture: Architecture = field(default_factory=lambda: Architecture("unknown"))

    def modules(self) -> list[str]:
        """Modules present, in :data:`MODULES` order."""
        present = {t.module for t in self.tensors}
        return [m for m in MODULES if m in present]

    def module_tensors(self, module: str, role: str | None = "main") -> list[ModelTensor]:
        """Tensors of ``module`` with ``role`` (None: every role)."""
        return [t for t in self.tensors
                if t.module == module and (role is None or t.role == role)]

    def module_bytes(self, module: str, role: str | None = "main") -> int:
        return sum(t.info.nbytes for t in self.module_tensors(module, role))

    def preview_bytes(self) -> int:
        """Bytes of the ``--taesd`` preview decoder (not the main VAE)."""
        return self.module_bytes("vae", "preview")

    def encoder_bytes(self, tensors: Iterable[ModelTensor] | None = None) -> dict[str, int]:
        """Bytes per ``te`` encoder of the files (of ``tensors``: the ``te`` ones given)."""
        out: Counter[str] = Counter()
        for t in self.module_tensors("te") if tensors is None else tensors:
            out[t.encoder or "te"] += t.info.nbytes
        return {e: out[e] for e in (*ENCODERS, "te") if out[e]}

    def block_encoder(self) -> str | None:
        """The dominant ``te`` encoder whose blocks are split (T5-XXL or the LLM, the larger
        when both; otherwise the largest CLIP), or None without ``te``."""
        enc = self.encoder_bytes()
        big: list[str] = [e for e in ("t5xxl", "llm") if e in enc]
        pool = big or list(enc)
        return max(pool, key=lambda e: enc[e]) if pool else None

    def dtype_mix(self, module: str | None = None, role: str | None = None) -> dict[str, int]:
        """Bytes per dtype (``F16``, ``BF16``, ``Q4_0``...), over one module (one role of it)
        or all."""
        out: Counter[str] = Counter()
        for t in self.tensors:
            if (module is None or t.module == module) and (role is None or t.role == role):
                out[t.info.dtype] += t.info.nbytes
        return dict(out.most_common())

    def module_profile(self, module: str, role: str | None = "main") -> ModuleProfile:
        """Block bytes (in block order) and non-block bytes of ``module`` (``role``
        ``high_noise``: a two-stage diffusion model's high-noise expert).

        The ``vae`` module is the main VAE; with only a ``--taesd`` file it is the TAE. ``te``
        leaves out the LLM tensors the family never reads (:mod:`sdplan.core.modelfiles.te_read`).
        """
        if module == "vae" and not self.module_tensors("vae", "main"):
            role = "preview"
        per_block: dict[tuple[int, int], int] = {}
        other = 0
        tensors = self.module_tensors(module, role)
        if module == "te":  # the LLM blocks after the last state the family reads do not load
            unread = unread_llm_tensors(tensors, self.architecture.name)
            tensors = [t for t in tensors if t.info.name not in unread]
        for t in tensors:
            if t.block is None:
                other += t.info.nbytes
            else:
                per_block[t.block] = per_block.get(t.block, 0) + t.info.nbytes
        blocks = tuple(per_block[k] for k in sorted(per_block))
        if module == "te":
            tail = sum(t.info.nbytes for t in tensors if t.encoder == "llm" and t.block is None and is_llm_tail(t.info.name))
            return ModuleProfile(blocks, other, self.encoder_bytes(tensors), self.block_encoder(), tail=tail)
        stages = () if blocks or module != "diffusion" else stage_bytes(
            (t.info.name, t.info.nbytes) for t in self.module_tensors(module, role))
        return ModuleProfile(blocks, other, stages=stages)

    def profile(self) -> Profile:
        """The planner's profile of this model set, named after the diffusion model's file
        (else the first file)."""
        mods = {m: self.module_profile(m) for m in self.modules()}
        diff = self.module_tensors("diffusion")
        first = diff[0].info.file if diff else self.files[0].path if self.files else None
        name = Path(first).name if first else None
        high = self.module_tensors("diffusion", "high_noise")
        phases = {"high_noise": self.module_profile("diffusion", "high_noise")} if high else {}
        return Profile(modules=mods, name=name, architecture=self.architecture.name, phases=phases,
                       autofit=autofit_component_bytes(self.tensors),
                       autofit_loaded=loaded_component_bytes(self.tensors))

    def to_json(self) -> dict[str, object]:
        """A JSON-ready summary: files, architecture, modules (bytes, blocks, dtypes)."""
        mods: dict[str, object] = {}
        for m in self.modules():
            mp = self.module_profile(m)
            d: dict[str, object] = {
                "bytes": mp.total, "tensors": len(self.module_tensors(m)),
                "blocks": len(mp.blocks), "block_bytes": sum(mp.blocks),
                "other_bytes": mp.other, "dtypes": self.dtype_mix(m),
            }
            if m == "te":
                d["encoders"] = dict(mp.encoders)
                d["block_encoder"] = mp.block_encoder
            if m == "vae" and self.preview_bytes():
                d["preview_bytes"] = self.preview_bytes()
            if m == "diffusion" and self.module_tensors(m, "high_noise"):
                d["dtypes"] = self.dtype_mix(m, "main")
                hp = self.module_profile(m, "high_noise")
                d["high_noise"] = {"bytes": hp.total, "tensors": len(self.module_tensors(m, "high_noise")),
                                   "blocks": len(hp.blocks), "block_bytes": sum(hp.blocks),
                                   "other_bytes": hp.other, "dtypes": self.dtype_mix(m, "high_noise")}
            mods[m] = d
        return {
            "files": [{"path": f.path, "format": f.format, "tensors": len(f.tensors),
                       "bytes": f.nbytes} for f in self.files],
            "architecture": {"name": self.architecture.name,
                             "family": self.architecture.family,
                             "variant": self.architecture.variant,
                             "evidence": list(self.architecture.evidence)},
            "modules": mods,
            "dtypes": self.dtype_mix(),
            "ignored": len(self.ignored),
            "profile": self.profile().to_json(),
        }


# --------------------------------------------------------------------------- blocks


def block_of(name: str) -> tuple[int, int] | None:
    """Spec section 8 block of a tensor name: ``(segment rank, index)`` or None.

    The first path segment of :data:`BLOCK_SEGMENTS` followed by a decimal index and then
    ``.`` or the end decides; names under a UNet stage (``input_blocks.``,
    ``down_blocks.``...) or Chroma's ``distilled_guidance_layer.`` (its ``layers.K`` run
    before any block, in sd-cli's prelude segment) are never block tensors. The rank orders
    segments as they execute (Flux: ``double_blocks`` before ``single_blocks``). sd-cli's renames of diffusers Flux
    ``single_transformer_blocks``, OpenCLIP ``resblocks`` and llama.cpp ``blk`` names
    apply first.
    """
    for part, pattern, repl in _SDCLI_RENAMES:
        if part in name:  # each pattern needs its part: a name without it is left as it is
            name = pattern.sub(repl, name)
    if _UNET_RE.search(name):
        return None
    m = _BLOCK_RE.search(name)
    if m is None:
        return None
    return BLOCK_SEGMENTS.index(m.group(1)), int(m.group(2))


# --------------------------------------------------------------------------- reading


def _normalise_flags(flags: Mapping[str, Sequence[str | Path]]) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    for key, paths in flags.items():
        k = key.strip().lstrip("-").replace("-", "_")
        k = {"m": "model", "controlnet": "control_net"}.get(k, k)
        if k not in FLAG_TARGETS:
            raise ValueError(f"unknown model-file flag {key!r}; known: {sorted(FLAG_TARGETS)}")
        if isinstance(paths, (str, Path)):
            paths = [paths]
        out.extend((k, Path(p)) for p in paths)
    return out


def read_model_files(flags: Mapping[str, Sequence[str | Path]],
                     headers: dict[str, TensorFile] | None = None) -> ModelSet:
    """Read and classify the model files of sd-cli's model flags.

    Args:
        flags: flag -> file paths; keys ``model``, ``diffusion_model``, ``clip_l``,
            ``clip_g``, ``t5xxl``, ``llm``, ``vae``, ``taesd``, ``control_net``,
            ``upscale_model``, ``photo_maker``, ``clip_vision`` (``-`` accepted for ``_``).
            A ``model`` entry is a full checkpoint, a standalone file recognised by its
            names, or a diffusers folder; other keys put every tensor into their module.
        headers: path -> header already read, filled with those read here
            (:func:`~sdplan.core.modelfiles.readers.read_header_once`); None: read them all.

    Raises:
        ModelFileError: a file is unreadable or hostile, is not a model (no tensor in a
            known layout), or repeats a tensor another file of the same module has.
        ValueError: an unknown flag key.
    """
    entries = _normalise_flags(flags)
    files: list[TensorFile] = []
    tensors: list[ModelTensor] = []
    ignored: list[tuple[TensorInfo, str]] = []
    for key, path in entries:
        module, encoder, role = FLAG_TARGETS[key]
        for tf, comp in _expand(path, key, headers):
            files.append(tf)
            if not tf.tensors:
                raise ModelFileError(tf.path, "not a model: the file holds no tensors")
            if comp is not None:
                cls, ign = _classify_component(tf, comp)
            elif module is None:
                cls, ign = classify_checkpoint(tf)
            else:
                enc = encoder
                if module == "te" and enc is None:
                    enc = _detect_encoder(tf)
                cls = [(t, module, enc) for t in tf.tensors]
                ign = []
            tensors.extend(ModelTensor(t, m, _vision(t.name, m, e), role) for t, m, e in cls)
            ignored.extend(ign)
    _check_duplicates(tensors)
    ms = ModelSet(files, [], ignored)
    dominant = _dominant(tensors)
    ms.tensors = [_with_block(t, dominant) for t in tensors]
    ms.architecture = detect_architecture(ms)
    return ms


def profile_from_model_flags(flags: Mapping[str, Sequence[str | Path]],
                             headers: dict[str, TensorFile] | None = None) -> Profile:
    """The planner's :class:`Profile` of sd-cli model flags (see :func:`read_model_files`;
    same arguments and errors)."""
    return read_model_files(flags, headers).profile()


def _dominant(tensors: Iterable[ModelTensor]) -> str | None:
    enc: Counter[str] = Counter()
    for t in tensors:
        if t.module == "te" and t.role == "main":
            enc[t.encoder or "te"] += t.info.nbytes
    big = [e for e in ("t5xxl", "llm") if enc[e]]
    pool = big or list(enc)
    return max(pool, key=lambda e: enc[e]) if pool else None


def _vision(name: str, module: str, encoder: str | None) -> str | None:
    """The encoder of a ``te`` tensor: ``llm_vision`` for an LLM's vision tower (``visual.``,
    Qwen2.5-VL's; sd-cli's ``--llm_vision`` part, never split: it stays on the main device),
    else ``encoder``."""
    return "llm_vision" if module == "te" and encoder == "llm" and _VISION_RE.search(name) else encoder


def _with_block(t: ModelTensor, dominant: str | None) -> ModelTensor:
    if t.module not in SPLITTABLE or t.role not in ("main", "high_noise"):
        return t
    if t.module == "te" and (t.encoder or "te") != dominant:
        return t
    b = block_of(t.info.name)
    return t if b is None else ModelTensor(t.info, t.module, t.encoder, t.role, b)


def _check_duplicates(tensors: list[ModelTensor]) -> None:
    seen: dict[tuple[str, str | None, str, str], str] = {}
    for t in tensors:
        key = (t.module, t.encoder, t.role, t.info.name)
        if key in seen and seen[key] != t.info.file:
            raise ModelFileError(t.info.file, f"tensor {t.info.name!r} of module {t.module} "
                                              f"is also in {seen[key]}")
        seen[key] = t.info.file


def _expand(path: Path, key: str, headers: dict[str, TensorFile] | None) -> list[tuple[TensorFile, str | None]]:
    """Files of one flag value: a file, a component folder or a diffusers pipeline folder.
    The second item is the diffusers component (``unet``...) or None."""
    st = stat_model_path(path)
    if st is None:
        raise ModelFileError(path, "no such file or folder")
    refuse_special_file(path)
    if stat.S_ISREG(st.st_mode):
        return [(read_header_once(path, headers), None)]
    comps = [d for d in _DIFFUSERS_DIRS if _is_dir(path / d)]
    if comps:
        if key != "model":
            raise ModelFileError(path, f"a diffusers pipeline folder goes to -m/--model, "
                                       f"not --{key.replace('_', '-')}")
        out: list[tuple[TensorFile, str | None]] = [
            (tf, c) for c in comps for tf in _component_files(path / c, headers)]
        if not out:
            raise ModelFileError(path, "diffusers folder without safetensors weights")
        return out
    plain = [c.name for c in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.gguf"))
             if c.name.count(".") == 1]
    if len(plain) > 1 and not any(path.glob("*.safetensors.index.json")):
        raise ModelFileError(path, f"folder holds {len(plain)} model files ({', '.join(plain[:3])}"
                                   f"{', ...' if len(plain) > 3 else ''}); name one of them")
    files = _component_files(path, headers)
    if not files:
        raise ModelFileError(path, "folder holds no .safetensors or .gguf model file")
    return [(tf, None) for tf in files]


def _is_dir(path: Path) -> bool:
    st = stat_model_path(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _is_file(path: Path, index: Path, shard: str) -> bool:
    """Whether a shard an index names is a regular file; a name that cannot be a file (too
    long...) is an error naming the index."""
    try:
        return safe_paths.is_file(path)
    except PathError as exc:
        raise ModelFileError(index, f"shard {shorten_name(shard)!r}: "
                                    f"{safe_paths.reason(exc)}") from None


def shorten_name(name: str, limit: int = 80) -> str:
    """``name`` when at most ``limit`` characters, else its head, ``…`` and its length."""
    return name if len(name) <= limit else f"{name[:limit - 20]}… ({len(name)} characters)"


def _component_files(folder: Path, headers: dict[str, TensorFile] | None) -> list[TensorFile]:
    """Headers of one diffusers component folder: its sharded index, else its single
    (non-variant preferred) safetensors file."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        idx = indexes[0]
        try:  # the one bounded JSON reader
            doc = read_json(idx, what="shard index")
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(weight_map, dict) or not all(
                    isinstance(v, str) for v in weight_map.values()):
                raise ValueError("no 'weight_map' of tensor names to shard files")
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError) as exc:
            reason = str(exc).removeprefix(f"{idx}: ")
            raise ModelFileError(idx, f"unreadable shard index ({reason})") from None
        out = []
        for shard in shards:
            sp = folder / shard
            if Path(shard).name != shard or not _is_file(sp, idx, shard):
                raise ModelFileError(idx, f"shard {shorten_name(shard)!r} is missing from {folder}")
            tf = read_header_once(sp, headers)
            listed = {n for n, f in weight_map.items() if f == shard}
            if listed != {t.name for t in tf.tensors}:
                raise ModelFileError(sp, f"tensors differ from those {idx.name} lists")
            out.append(tf)
        return out
    cands = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.gguf"))
    if not cands:
        return []
    plain = [c for c in cands if c.name.count(".") == 1] or cands
    if len(cands) > 1:
        log.info("%s: several weight files, using %s", folder, plain[0].name)
    return [read_header_once(plain[0], headers)]


def _classify_component(tf: TensorFile, comp: str
                        ) -> tuple[list[tuple[TensorInfo, str, str | None]], list]:
    module = _DIFFUSERS_DIRS[comp]
    enc = _detect_encoder(tf) if module == "te" else None
    return [(t, module, enc) for t in tf.tensors], []


def _detect_encoder(tf: TensorFile) -> str | None:
    names = {t.name: t for t in tf.tensors}
    if any(_T5_RE.search(n) for n in names):
        return "t5xxl"
    for n, t in names.items():
        if n.endswith("token_embedding.weight") and len(t.shape) == 2:
            return _CLIP_BY_WIDTH.get(t.shape[1], "clip_l")
    if any(n.startswith(("blk.", "model.layers.", "layers.")) for n in names):
        return "llm"
    return None


def classify_checkpoint(tf: TensorFile
                         ) -> tuple[list[tuple[TensorInfo, str, str | None]],
                                    list[tuple[TensorInfo, str]]]:
    """A ``-m`` file's tensors as ``(tensor, module, encoder)`` (the prefixed single-file
    layout, else one standalone module) and the ``(tensor, reason)`` sd-cli does not load.
    Raises ModelFileError when no name is in a known layout."""
    cls: list[tuple[TensorInfo, str, str | None]] = []
    rest: list[TensorInfo] = []
    for t in tf.tensors:
        hit = _prefix_target(t.name)
        if hit is None:
            rest.append(t)
        else:
            cls.append((t, *hit))
    if not cls:
        target = detect_standalone(tf)
        if target is None:
            first = ", ".join(t.name for t in tf.tensors[:3])
            raise ModelFileError(tf.path, f"not a model: none of its {len(tf.tensors)} "
                                          f"tensor names is in a known layout ({first}, ...)")
        module, enc = target
        return [(t, module, enc) for t in tf.tensors], []
    ignored = []
    for t in rest:
        reason = ("EMA weights" if t.name.startswith("model_ema.")
                  else "training buffer" if "." not in t.name else "unknown tensor")
        ignored.append((t, reason))
    return cls, ignored


def _prefix_target(name: str) -> tuple[str, str | None] | None:
    for prefix, module, enc in _PREFIXES:
        if name.startswith(prefix):
            return module, enc
    m = _EMBEDDER_RE.match(name)
    if m:  # SDXL: HF CLIP-L under .transformer., OpenCLIP bigG under .model.
        return "te", "clip_l" if m.group(2) == "transformer" else "clip_g"
    return None


def detect_standalone(tf: TensorFile) -> tuple[str, str | None] | None:
    """``(module, encoder)`` of a file without single-file prefixes, or None.

    Recognises Flux/SD3 DiTs, diffusers UNet/transformer files, ControlNets, T5, CLIP,
    llama.cpp/transformers LLMs, VAEs, the TAE family, ESRGAN upscalers, PhotoMaker and
    CLIP vision files by their tensor names.
    """
    names = [t.name for t in tf.tensors]

    def has(*prefixes: str) -> bool:
        return any(n.startswith(prefixes) for n in names)

    def contains(*parts: str) -> bool:
        return any(p in n for n in names for p in parts)

    if contains("input_hint_block.", "controlnet_cond_embedding.", "zero_convs."):
        return "controlnet", None
    if has("id_encoder.", "fuse_module.", "qformer_perceiver."):
        return "photomaker", None
    if has("double_blocks.", "single_blocks.", "joint_blocks.", "input_blocks.",
           "down_blocks.", "transformer_blocks.", "single_transformer_blocks.", *DIFFUSION_MARKERS) \
            or WAN_MARKER in names:
        return "diffusion", None
    if has("vision_model."):
        return "clip_vision", None
    enc = _detect_encoder(tf)
    if enc is not None:
        return "te", enc
    if has("encoder.conv_in.", "decoder.conv_in.", "encoder.down.", "decoder.up.",
           "decoder.middle.", "decoder.upsamples."):  # the last two: the Wan 2.1 autoencoder
        return "vae", None
    if all(n.split(".", 1)[0].isdigit() for n in names) or has(
            "encoder.layers.", "decoder.layers."):
        return "vae", None  # TAE family: flat numbered layers
    if has("body.", "conv_first.", "RRDB_trunk.", "model.1.sub."):
        return "upscaler", None
    return None


# --------------------------------------------------------------------------- architecture


def _local(name: str) -> str:
    return name[len("model.diffusion_model."):] if name.startswith(
        "model.diffusion_model.") else name


def detect_architecture(ms: ModelSet) -> Architecture:
    """Architecture of the model set from its diffusion tensors' names and shapes: the family
    registry's rules (:func:`sdplan.core.families.detect_family`: Z-Image, FLUX.2, FLUX.1 /
    Chroma, SD3, the UNets by context width or ``sdplan.family`` metadata), given the diffusion
    tensors without ``model.diffusion_model.``, the ``llm`` encoder's names (its vision tower's
    included), the files' metadata and the text encoders among the files."""
    diff = {_local(t.info.name): t.info.shape for t in ms.module_tensors("diffusion")}
    llm = [t.info.name for t in ms.module_tensors("te") if t.encoder in ("llm", "llm_vision")]
    meta = [str(f.metadata.get("sdplan.family")) for f in ms.files if f.metadata.get("sdplan.family")]
    encoders = {t.encoder for t in ms.module_tensors("te")}
    return Architecture(*detect_family(DiffusionTensors(diff, tuple(llm), tuple(meta),
                                                        frozenset(e for e in encoders if e))))

