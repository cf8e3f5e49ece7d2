"""A model set's ``--vae`` and ``--llm`` checked against its family's declaration, from the
headers, before anything loads.

Each family declares what its DiT pairs with (:mod:`sdplan.core.families`): its autoencoder's
latent channels (:attr:`~sdplan.core.families.declaration.Companions.latent_channels`, named
by :attr:`~sdplan.core.families.declaration.Companions.autoencoder`), and for an LLM text
encoder the DiT tensor whose last dimension is the width of the text states it takes
(:attr:`~sdplan.core.families.declaration.Family.text_width`) with the states it reads
(:attr:`~sdplan.core.families.declaration.Family.llm_layers`). :func:`check_companions`
compares the files with those declarations, so a set the engine cannot run (a FLUX.1
autoencoder given to FLUX.2 klein, klein 9B's Qwen3-8B given to Z-Image) is refused in one
line naming the flag and the file, by ``sdplan plan`` and ``sdplan generate`` alike, instead
of by the pipeline once the engine process has started.

What the headers say:

- an autoencoder's latent channels are the input channels of its decoder's first
  convolution: ``decoder.conv_in.weight`` ``(C, latent, 3, 3)`` (the 2-D autoencoders of SD,
  SD3, FLUX.1 and FLUX.2) or ``decoder.conv1.weight`` ``(C, latent, 3, 3, 3)`` (the causal
  3-D Wan autoencoders);
- a language model's hidden width is the length of block 0's first norm
  (``layers.0.input_layernorm.weight``, llama.cpp's ``blk.0.attn_norm.weight``: the
  embedding width), its block count the distinct block numbers after that prefix.

A file whose layout says neither passes (the pipeline names what it lacks when it loads), as
does a family without a declaration. Pure Python over headers.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdplan.core.errors import ModelFileError
from sdplan.core.families.declaration import Family
from sdplan.core.families.tensors import llm_family
from sdplan.core.modelfiles.readers import read_tensor_file, stat_model_path

__all__ = ["AUTOENCODERS", "check_companions", "llm_width", "regular_files", "vae_latent"]

#: ``(latent channels, convolution dims)`` -> what an autoencoder of that layout is, for
#: people: SD 1.x/2.x and SDXL share the 4-channel layout, FLUX.1 and SD3 the 16-channel one.
AUTOENCODERS = {(4, 2): "an SD / SDXL autoencoder", (16, 2): "a FLUX.1 or SD3 autoencoder",
                (32, 2): "a FLUX.2 autoencoder", (16, 3): "the Wan 2.1 autoencoder",
                (48, 3): "the Wan 2.2 autoencoder"}
#: convolution dims -> how a refusal names an autoencoder's layout
_CONVOLUTIONS = {2: "2-D", 3: "3-D causal"}
_DECODER_IN = {"decoder.conv_in.weight": 4, "decoder.conv1.weight": 5}
_LLM_BLOCK0 = re.compile(r"^(.*?)(?:(layers)\.0\.input_layernorm|(blk)\.0\.attn_norm)\.weight$")
_DIFFUSION_PREFIX = "model.diffusion_model."


def regular_files(files: Mapping[str, Sequence[str]], key: str) -> list[str]:
    """The paths of ``files[key]`` that are regular files: folders, missing paths and special
    files are left to :func:`~sdplan.core.modelfiles.checkpoint.read_model_files`, which
    names them.

    Raises:
        ModelFileError: a path that cannot be examined (a name too long...), naming it.
    """
    out = []
    for path in files.get(key, ()):
        st = stat_model_path(path)
        if st is not None and stat.S_ISREG(st.st_mode):
            out.append(str(path))
    return out


def vae_latent(path: str | Path) -> tuple[int, int] | None:
    """``(latent channels, convolution dims)`` of an autoencoder file from its decoder's first
    convolution (module docstring; dims 2 or 3), or None when it has neither name.

    Raises:
        ModelFileError: the file cannot be read (as :func:`read_tensor_file`).
    """
    for t in read_tensor_file(path).tensors:
        for suffix, rank in _DECODER_IN.items():
            if (t.name == suffix or t.name.endswith("." + suffix)) and len(t.shape) == rank:
                return int(t.shape[1]), rank - 2
    return None


def llm_width(path: str | Path) -> tuple[int, int, str | None] | None:
    """``(hidden width, blocks, kind)`` of a language-model file (module docstring; ``kind``
    as :func:`sdplan.core.families.tensors.llm_family`: ``qwen3, 36 blocks``), or None when
    no block 0 norm is found.

    Raises:
        ModelFileError: the file cannot be read (as :func:`read_tensor_file`).
    """
    tensors = read_tensor_file(path).tensors
    for t in tensors:
        m = _LLM_BLOCK0.match(t.name)
        if m and len(t.shape) == 1:
            blocks = re.compile(re.escape(m.group(1) + (m.group(2) or m.group(3))) + r"\.(\d+)\.")
            n = len({b.group(1) for u in tensors if (b := blocks.match(u.name))})
            return int(t.shape[0]), n, llm_family(u.name for u in tensors)
    return None


def check_companions(models: Any, fam: Family, files: Mapping[str, Sequence[str]]) -> None:
    """Refuse a ``--vae`` or ``--llm`` file that does not fit ``fam``'s declaration (module
    docstring).

    Args:
        models: the :class:`~sdplan.core.modelfiles.checkpoint.ModelSet` read from ``files``
            (its architecture's variant, its diffusion tensors' shapes).
        fam: its family.
        files: sd-cli's model flag keys -> paths (only regular files are checked).

    Raises:
        ModelFileError: ``"FILE: --vae: a FLUX.1 or SD3 autoencoder (16 latent channels);
            FLUX.2 klein needs the FLUX.2 autoencoder (32 latent channels)"``, ``"FILE: --llm:
            a language model of hidden width 4096 (qwen3, 36 blocks); this Z-Image DiT reads
            one state of width 2560 (Qwen3-4B)"``, or the states it reads that the encoder
            lacks. An autoencoder of the declared channels in the other layout
            (:attr:`~sdplan.core.families.declaration.Companions.autoencoder_dims`) is refused
            naming both: ``"FILE: --vae: a FLUX.1 or SD3 autoencoder (16 latent channels,
            2-D); Qwen-Image needs the Qwen-Image (Wan 2.1) autoencoder (16 latent channels,
            3-D causal)"``.
    """
    comp = fam.companions_for(models.architecture.variant)
    for path in regular_files(files, "vae") if comp.latent_channels else ():
        found = vae_latent(path)
        if found is not None and found != (comp.latent_channels, comp.autoencoder_dims):
            # the same channels in the other layout (FLUX.1's ae for Qwen-Image): say the layouts
            layouts = found[0] == comp.latent_channels
            have = f"{found[0]} latent channels" + (f", {_CONVOLUTIONS[found[1]]}" if layouts else "")
            want = f"{comp.latent_channels} latent channels" + \
                (f", {_CONVOLUTIONS[comp.autoencoder_dims]}" if layouts else "")
            what = AUTOENCODERS.get(found, "an autoencoder")
            named = f"the {comp.autoencoder} autoencoder" if comp.autoencoder else "an autoencoder"
            raise ModelFileError(path, f"--vae: {what} ({have}); {fam.title} needs {named} ({want})")
    width = _text_width(models, fam)
    if width is not None:
        for path in regular_files(files, "llm"):
            _check_llm(path, fam, width)


def _check_llm(path: str, fam: Family, width: int) -> None:
    """Refuse the ``--llm`` file ``path`` without a state ``fam`` reads, or whose hidden width
    times the states it reads is not the DiT's text ``width`` (:func:`check_companions`)."""
    llm = llm_width(path)
    if llm is None:
        return
    hidden, blocks, kind = llm
    have = f"a language model of hidden width {hidden}" + (f" ({kind})" if kind else "")
    try:
        fam.llm_out_layers(blocks)
    except ValueError:
        names = " or ".join(dict.fromkeys(fam.llm_widths.values()))
        layers = ", ".join(str(k) for k in fam.llm_layers)
        raise ModelFileError(path, f"--llm: {have}; {fam.title} reads the states of "
                                   f"{names or 'its LLM'} (layers {layers}), which it lacks") from None
    states = len(fam.llm_layers) or 1
    if hidden * states == width:
        return
    reads = "one state" if states == 1 else f"{states} states"
    if width % states:
        reads += f" {width} wide together"
    else:
        name = fam.llm_widths.get(width // states)
        reads += f" of width {width // states}" + (f" ({name})" if name else "")
    raise ModelFileError(path, f"--llm: {have}; this {fam.title} DiT reads {reads}")


def _text_width(models: Any, fam: Family) -> int | None:
    """The width of the text states ``fam``'s DiT among ``models`` takes (the last dimension of
    its first :attr:`~sdplan.core.families.declaration.Family.text_width` tensor), or None."""
    if not fam.text_width:
        return None
    shapes = {t.info.name.removeprefix(_DIFFUSION_PREFIX): t.info.shape for t in models.module_tensors("diffusion")}
    for name in fam.text_width:
        shape = shapes.get(name)
        if shape:
            return int(shape[-1])
    return None
