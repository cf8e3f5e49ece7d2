"""LoRA files: find them, read their keys, and map every key onto the model's own weights.

A LoRA file holds, per patched layer, a few tensors named ``<layer><suffix>``:

- LoRA (kohya ``.lora_down.weight``/``.lora_up.weight``/``.lora_mid.weight``, diffusers
  ``.lora.down.weight``/``_lora.down.weight``/``.lora_linear_layer.down.weight``, PEFT
  ``.lora_A.weight``/``.lora_B.weight``; LoCon is the same on conv layers) with an optional
  ``.alpha``: ``delta = (alpha / rank) * up @ [mid] @ down``;
- LoHa (``.hada_w1_a``, ``.hada_w1_b``, ``.hada_w2_a``, ``.hada_w2_b``, Tucker ``.hada_t1``/
  ``.hada_t2``, ``.alpha``): ``delta = (alpha / rank) * (w1a @ w1b) * (w2a @ w2b)``;
- LoKr (``.lokr_w1`` or ``.lokr_w1_a``/``_b``, ``.lokr_w2`` or ``.lokr_w2_a``/``_b``,
  ``.lokr_t2``, ``.alpha``): ``delta = scale * kron(w1, w2)``, scale ``alpha / rank`` of the
  factorised side (1 when neither side is factorised);
- a full difference (``.diff``): ``delta = diff``.

Layer names are prefixed by what they patch (kohya ``lora_unet_``, ``lora_te1_``...;
diffusers ``unet.``, ``text_encoder_2.``; ``transformer.``, ``diffusion_model.``) and
matched against the family's :data:`~sdplan.core.modelfiles.lora_names.AliasTable`, dotted
or with every dot as an underscore (kohya). A key that matches nothing, or a suffix sdplan
does not apply (DoRA's ``dora_scale``, bias ``diff_b``), is listed in
:attr:`LoraFile.unknown` by name; it is never silently dropped. The formulas are
stable-diffusion.cpp's ``src/model/adapter/lora.hpp`` (LyCORIS' definitions).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sdplan.core.errors import InvalidArgument, ModelFileError
from sdplan.core.families import lora_family
from sdplan.core.modelfiles.checkpoint import ModelSet, shorten_name
from sdplan.core.modelfiles.lora_names import AliasTable, Target
from sdplan.core.modelfiles.readers import TensorInfo, read_tensor_file
from sdplan.core.planning import paths as safe_paths
from sdplan.core.planning.adapters import PLAN_MODULE, LoraProfile

__all__ = ["LoraPart", "LoraFile", "read_lora", "find_lora_file", "LORA_EXTENSIONS", "guess_lora_family",
           "KINDS", "runtime_bytes", "lora_profiles", "model_aliases", "quantized"]

#: Extensions tried, in order, for a tag's name without one (sd-cli's list).
LORA_EXTENSIONS = (".gguf", ".safetensors", ".pt", ".ckpt")
#: Patch kinds and the roles each needs.
KINDS = {"lora": ("down", "up"), "loha": ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"),
         "lokr": (), "diff": ("diff",)}

_SUFFIXES = (
    (".lora_down.weight", "down"), (".lora_up.weight", "up"), (".lora_mid.weight", "mid"),
    (".lora_linear_layer.down.weight", "down"), (".lora_linear_layer.up.weight", "up"),
    (".lora.down.weight", "down"), (".lora.up.weight", "up"),
    ("_lora.down.weight", "down"), ("_lora.up.weight", "up"),
    (".alpha", "alpha"), (".diff_b", "diff_b"), (".diff", "diff"), (".dora_scale", "dora_scale"),
    (".lora_magnitude_vector.weight", "dora_scale"), (".lora_magnitude_vector", "dora_scale"),
    *((f".hada_{r}", f"hada_{r}") for r in ("w1_a", "w1_b", "w2_a", "w2_b", "t1", "t2")),
    *((f".lokr_{r}", f"lokr_{r}") for r in ("w1_a", "w1_b", "w2_a", "w2_b", "t2", "w1", "w2")),
)
_PEFT = re.compile(r"\.lora_([AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")
#: key prefix -> (namespace, underscore-separated path)
_PREFIXES = (
    ("lora_unet_", "unet", True), ("lora_transformer_", "unet", True),
    ("lora_te1_", "te1", True), ("lora_te2_", "te2", True), ("lora_te3_", "te3", True),
    ("lora_te_", "te1", True),
    ("base_model.model.", "unet", False), ("model.diffusion_model.", "unet", False),
    ("diffusion_model.", "unet", False), ("transformer.", "unet", False), ("unet.", "unet", False),
    ("text_encoder_2.", "te2", False), ("text_encoder_3.", "te3", False), ("text_encoder.", "te1", False),
)
_SUPPORTED_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


@dataclass(frozen=True)
class LoraPart:
    """The tensors of one LoRA file that patch one target.

    Attributes:
        target: what it patches (:class:`~sdplan.core.modelfiles.lora_names.Target`).
        kind: ``lora``, ``loha``, ``lokr`` or ``diff``.
        keys: role (``down``, ``up``, ``mid``, ``alpha``, ``hada_w1_a``, ``lokr_w2``...) ->
            tensor name in the file.
    """

    target: Target
    kind: str
    keys: Mapping[str, str]


@dataclass
class LoraFile:
    """A LoRA file mapped onto one model (see the module docstring).

    Attributes:
        path: the file.
        format: ``kohya``, ``peft``, ``diffusers`` or ``original`` (the model's own names),
            from its keys (informative).
        parts: every patch, in file order of their first key.
        unknown: keys that patch nothing sdplan knows, with the reason after `` - ``.
        infos: tensor name -> header entry (safetensors/GGUF), for sizes and reading.
    """

    path: str
    format: str
    parts: list[LoraPart]
    unknown: list[str]
    infos: dict[str, TensorInfo]
    _arrays: dict[str, np.ndarray] | None = field(default=None, repr=False)

    def modules(self) -> list[str]:
        """The engine modules it patches, sorted."""
        return sorted({p.target.module for p in self.parts})

    def nbytes(self, module: str | None = None) -> int:
        """File bytes of the tensors patching ``module`` (None: every part)."""
        keys = {k for p in self.parts if module is None or p.target.module == module for k in p.keys.values()}
        return sum(self.infos[k].nbytes for k in keys)

    def read(self, key: str) -> np.ndarray:
        """Tensor ``key`` as float32 (numpy order).

        Raises:
            ModelFileError: a quantized or integer tensor, or a short file.
        """
        if self._arrays is not None:
            return np.asarray(self._arrays[key], dtype=np.float32)
        info = self.infos[key]
        dt = _SUPPORTED_DTYPES.get(info.dtype.upper())
        if dt is None:
            raise ModelFileError(self.path, f"tensor {key!r}: LoRA tensors in {info.dtype} are not "
                                            "supported (F32, F16, BF16)")
        n = int(np.prod(info.shape, dtype=np.int64)) if info.shape else 1
        try:
            raw = np.fromfile(self.path, dtype=dt, count=n, offset=info.offset)
        except OSError as exc:
            raise ModelFileError(self.path, f"cannot read {key!r}: {exc}") from None
        if raw.size != n:
            raise ModelFileError(self.path, f"tensor {key!r}: the file ends early")
        if info.dtype.upper() == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32).reshape(info.shape)

    def scalar(self, key: str) -> float:
        """A one-element tensor (``alpha``) as a float."""
        return float(self.read(key).reshape(-1)[0])


def find_lora_file(name: str, lora_dir: str | Path | None) -> Path:
    """The file of a prompt's ``<lora:NAME:...>``: ``NAME`` when absolute, else under
    ``lora_dir`` (None: the working folder); without that file, ``NAME`` plus each of
    :data:`LORA_EXTENSIONS` in order (sd-cli's rule).

    Raises:
        InvalidArgument: no such file, or a name that cannot be a file (too long, in a
            folder without search permission...); the message names the tag and the folder.
    """
    raw = Path(name)
    base = raw if raw.is_absolute() else Path(lora_dir or ".") / raw
    tag = f"<lora:{shorten_name(name)}:...>"
    try:
        if safe_paths.is_file(base):
            return base
        for ext in LORA_EXTENSIONS:
            cand = base.with_name(base.name + ext)
            if safe_paths.is_file(cand):
                return cand
    except OSError as exc:  # PathError: a name too long, a folder without permission
        raise InvalidArgument(f"{tag}: {safe_paths.reason(exc)}") from None
    except ValueError:  # Path.with_name of a name without a file name ("/", ".")
        raise InvalidArgument(f"{tag}: not a file name") from None
    where = f"--lora-model-dir {str(lora_dir)!r}" if lora_dir else "the working folder"
    raise InvalidArgument(f"{tag}: no LoRA file {shorten_name(raw.name)!r} (or with {', '.join(LORA_EXTENSIONS)}) "
                      f"in {where}")


def _split(key: str) -> tuple[str, str] | None:
    """``(layer, role)`` of a key, or None when its suffix is not a LoRA role."""
    m = _PEFT.search(key)
    if m:
        return key[:m.start()], "down" if m.group(1) == "A" else "up"
    for suffix, role in _SUFFIXES:
        if key.endswith(suffix):
            return key[:-len(suffix)], role
    return None


def _namespace(layer: str) -> tuple[str, str, bool]:
    for prefix, space, underscored in _PREFIXES:
        if layer.startswith(prefix):
            return space, layer[len(prefix):], underscored
    return "unet", layer, False


def _normalise(path: str, space: str) -> list[str]:
    """Spellings of old diffusers attention-processor names to try after ``path``."""
    out = [path]
    p = path.replace(".processor.", ".")
    if p.endswith(".to_out"):
        p += ".0"
    if space != "unet":
        p = re.sub(r"self_attn\.to_([qkv])$", r"self_attn.\1_proj", p)
        p = re.sub(r"self_attn\.to_out(\.0)?$", "self_attn.out_proj", p)
    if p != path:
        out.append(p)
    return out


class _Matcher:
    def __init__(self, table: AliasTable) -> None:
        self.table = table
        self.flat = {space: {k.replace(".", "_"): t for k, t in paths.items()} for space, paths in table.items()}

    def find(self, space: str, path: str, underscored: bool) -> Target | None:
        spaces = [space] + ([s for s in ("te1", "unet") if s != space] if not underscored and space == "unet" else [])
        for s in spaces:
            for p in ([path] if underscored else _normalise(path, s)):
                t = (self.flat if underscored else self.table).get(s, {}).get(p)
                if t is None and not underscored:
                    t = self.flat.get(s, {}).get(p.replace(".", "_"))
                if t is not None:
                    return t
        return None


def _kind(roles: Mapping[str, str]) -> str | None:
    if "down" in roles and "up" in roles:
        return "lora"
    if all(r in roles for r in KINDS["loha"]):
        return "loha"
    if ("lokr_w1" in roles or {"lokr_w1_a", "lokr_w1_b"} <= set(roles)) and (
            "lokr_w2" in roles or {"lokr_w2_a", "lokr_w2_b"} <= set(roles)):
        return "lokr"
    if "diff" in roles:
        return "diff"
    return None


_USED = {"lora": {"down", "up", "mid", "alpha"}, "diff": {"diff"},
         "loha": {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2", "alpha"},
         "lokr": {"lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2", "alpha"}}


def _format(keys: list[str]) -> str:
    if any(k.startswith("lora_") for k in keys):
        return "kohya"
    if any(_PEFT.search(k) for k in keys):
        return "peft"
    if any(".lora.down." in k or "_lora.down." in k or ".lora_linear_layer." in k for k in keys):
        return "diffusers"
    return "original"


def read_lora(path: str | Path, table: AliasTable) -> LoraFile:
    """Read a LoRA file's keys (``.safetensors``/``.gguf`` headers; ``.pt``/``.ckpt`` through
    the restricted pickle reader) and map them onto the model whose names ``table`` lists.

    Raises:
        ModelFileError: unreadable file, or not one key patches this model (the message
            names the first keys, so a LoRA for another family says so at once).
    """
    p = Path(path)
    arrays: dict[str, np.ndarray] | None = None
    if p.suffix.lower() in (".pt", ".ckpt", ".pth"):
        from sdplan.core.modelfiles.pth import load_pth_tensors

        arrays = load_pth_tensors(p)
        infos = {k: TensorInfo(k, "F32", tuple(int(d) for d in v.shape), int(v.size) * 4, 0, str(p))
                 for k, v in arrays.items()}
    else:
        infos = {t.name: t for t in read_tensor_file(p).tensors}
    matcher = _Matcher(table)
    groups: dict[tuple[str, str, bool], dict[str, str]] = {}
    unknown: list[str] = []
    for key in infos:
        split = _split(key)
        if split is None:
            unknown.append(f"{key} - not a LoRA tensor name")
            continue
        layer, role = split
        space, sub, underscored = _namespace(layer)
        groups.setdefault((space, sub, underscored), {})[role] = key
    parts: list[LoraPart] = []
    for (space, sub, underscored), roles in groups.items():
        target = matcher.find(space, sub, underscored)
        kind = _kind(roles)
        if target is None:
            unknown += [f"{k} - no layer {sub!r} in this model" for k in roles.values()]
            continue
        if kind is None:
            unknown += [f"{k} - incomplete patch (roles {sorted(roles)})" for k in roles.values()]
            continue
        parts.append(LoraPart(target, kind, {r: k for r, k in roles.items() if r in _USED[kind]}))
        unknown += [f"{k} - {r} is not applied by sdplan" for r, k in roles.items() if r not in _USED[kind]]
    if not parts:
        first = ", ".join(list(infos)[:3])
        raise ModelFileError(p, f"not one key patches this model (first keys: {first}); a LoRA "
                                "for another model family?")
    return LoraFile(str(p), _format(list(infos)), parts, unknown, infos, arrays)


def guess_lora_family(path: str | Path) -> str:
    """The model family a LoRA file was trained for, from its key names and shapes (header
    only; :func:`sdplan.core.families.lora_family`): ``flux``, ``sd3``, ``sdxl``, ``sd1``,
    ``sd2`` or ``unknown``. SD 1.x/2.x/SDXL are told apart by the cross-attention context
    width (768, 1024, 2048: the input width of an ``attn2.to_k`` down matrix) or a second text
    encoder.

    Raises:
        ModelFileError: unreadable file.
    """
    tensors = read_tensor_file(path).tensors
    return lora_family([t.name for t in tensors], {t.name: tuple(t.shape) for t in tensors})


def _rank(lf: LoraFile, part: LoraPart) -> int:
    info = lf.infos[part.keys["mid"] if "mid" in part.keys else part.keys["down"]]
    return int(info.shape[0])


def runtime_bytes(files: Sequence[LoraFile], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Bytes the engine holds on a device for each patched weight in ``at_runtime`` mode
    (:mod:`sdplan.core.runtime.lora`), from the headers alone: low-rank parts stacked into
    ``down`` ``(R, in...)`` and ``up`` ``(out, R)`` in f16 (``R`` the summed ranks, ``up``
    covering the whole output axis of a fused weight), dense parts (LoHa, LoKr, diff) one f32
    copy of the weight. ``shapes``: weight name -> numpy-order shape. Keys: weight names."""
    ranks: dict[str, int] = {}
    dense: set[str] = set()
    for lf in files:
        for p in lf.parts:
            if p.kind == "lora":
                ranks[p.target.tensor] = ranks.get(p.target.tensor, 0) + _rank(lf, p)
            else:
                dense.add(p.target.tensor)
    out: dict[str, int] = {}
    for name in set(ranks) | dense:
        shape = shapes[name]
        inner = int(np.prod(shape[1:], dtype=np.int64))
        r = ranks.get(name, 0)
        out[name] = 2 * r * (inner + int(shape[0])) + (4 * int(np.prod(shape, dtype=np.int64)) if name in dense else 0)
    return out


def lora_profiles(files: Sequence[LoraFile], ms: ModelSet) -> dict[str, LoraProfile]:
    """Per plan module, the at-runtime LoRA bytes of ``files`` per block of the module's
    profile (:meth:`~sdplan.core.modelfiles.checkpoint.ModelSet.module_profile` order) and
    outside blocks: what :func:`sdplan.core.planning.estimate.estimate_plan` counts."""
    by_name = {t.info.name: t for t in ms.tensors}
    sizes = runtime_bytes(files, {n: tuple(t.info.shape) for n, t in by_name.items()})
    order: dict[str, list[tuple[int, int]]] = {}
    blocks: dict[str, dict[int, int]] = {}
    other: dict[str, int] = {}
    for name, n in sizes.items():
        t = by_name[name]
        module = PLAN_MODULE.get(t.module, t.module)
        if t.block is None:
            other[module] = other.get(module, 0) + n
            continue
        if module not in order:
            order[module] = sorted({u.block for u in ms.tensors if u.module == t.module and u.block is not None})
        i = order[module].index(t.block)
        blocks.setdefault(module, {})[i] = blocks.get(module, {}).get(i, 0) + n
    return {m: LoraProfile(blocks.get(m, {}), other.get(m, 0)) for m in set(blocks) | set(other)}


def model_aliases(ms: ModelSet) -> AliasTable:
    """The :data:`~sdplan.core.modelfiles.lora_names.AliasTable` of a model set as its
    pipeline names the modules (SD: ``diffusion``, ``te``; Flux: ``diffusion``, ``clip_l``,
    ``t5xxl``), for planning before anything loads."""
    from sdplan.core.modelfiles.lora_names import aliases_for_family

    names: dict[str, list[str]] = {}
    for t in ms.tensors:
        names.setdefault(t.module, []).append(t.info.name)
        if t.module == "te" and t.encoder:
            names.setdefault(t.encoder, []).append(t.info.name)
    return aliases_for_family(ms.architecture.family, names, {t.info.name: tuple(t.info.shape) for t in ms.tensors})


def quantized(ms: ModelSet) -> bool:
    """Whether a weight of the model set is quantized (sd-cli's ``auto`` apply-mode test)."""
    plain = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}
    return any(t.info.dtype.upper() not in plain for t in ms.tensors)
