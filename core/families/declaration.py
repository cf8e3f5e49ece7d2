"""What a family declaration holds: :class:`Family` and the values it is made of.

A :class:`Family` says how the family is recognised (its detection rule over the diffusion
tensors, and its LoRA files' rule), which modules and model files it has, which generation
options its pipeline honours (:mod:`sdplan.core.families.options`), sd-cli's defaults for it,
its trained sizes and size rule, the constants the memory estimate and the library use, its
latent format (previews), and its pipeline: the ``"module:function"`` the engine job calls
(``generate(request, plan, progress) -> result``), loaded only when a picture of the family is
made. The declarations are in the modules named after the families (``sd``, ``sdxl``,
``sd3``, ``flux``, ``chroma``, ``z_image``, ``flux2``); :mod:`sdplan.core.families.registry`
holds them in detection order and answers every question about them.

Pure Python: no numpy, no native module, no Qt (the command line reads it before the engine
starts).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Defaults", "Companions", "ComputeShape", "Detection", "DiffusionTensors", "Family",
           "Rule", "LoraRule"]


@dataclass(frozen=True)
class Defaults:
    """sd-cli's generation settings for a family (what a run uses when the user gives none).

    Attributes:
        cfg_scale: ``--cfg-scale`` (1: no classifier-free guidance).
        steps: ``--steps``.
        sampling_method: ``--sampling-method``.
        width, height: ``-W``/``-H`` in pixels (None: sd-cli's 512, the family names none).
        scheduler: ``--scheduler`` (``default``: the family's own sigma schedule).
        guidance: ``--guidance`` (distilled guidance, FLUX.1 dev).
        clip_skip: the CLIP layer the prompt is read from when ``--clip-skip`` is not given
            (1: the last; SD 2.x reads the second to last).
    """

    cfg_scale: float
    steps: int
    sampling_method: str
    width: int | None = None
    height: int | None = None
    scheduler: str = "default"
    guidance: float = 3.5
    clip_skip: int = 1

    def settings(self) -> dict[str, object]:
        """The settings a generation panel takes from the family, by sd-cli's request keys:
        ``cfg_scale``, ``steps``, ``sampling_method``, and ``width``/``height`` when the
        family names a size."""
        out: dict[str, object] = {"cfg_scale": self.cfg_scale, "steps": self.steps,
                                  "sampling_method": self.sampling_method}
        if self.width and self.height:
            out.update(width=self.width, height=self.height)
        return out


@dataclass(frozen=True)
class Companions:
    """What a diffusion model of the family pairs with in the library.

    Attributes:
        encoders: the text encoders it reads (``clip_l``, ``clip_g``, ``clip_h``, ``t5xxl``,
            ``llm``).
        latent_channels: its autoencoder's latent channels (None: a pixel-space model).
        size: the image side (pixels) its fit is estimated at.
        prefers, avoids: text in a companion's file name that ranks it first (SDXL: ``xl``)
            or last (the others: ``xl``, an SDXL file of the same latent channels).
        autoencoder: its autoencoder's name for people (``FLUX.2``), in the refusal of a
            ``--vae`` of other latent channels
            (:func:`sdplan.core.modelfiles.file_sets.check_companions`); empty: unnamed.
        autoencoder_dims: the dimensions its autoencoder's convolutions run over: 2 for the
            image autoencoders (SD, SDXL, SD3, FLUX.1, FLUX.2), 3 for the causal video
            autoencoders of Wan, which Qwen-Image also decodes with; FLUX.1's and Wan 2.1's
            both have 16 latent channels, so the channels alone do not tell them apart.
    """

    encoders: tuple[str, ...]
    latent_channels: int | None
    size: int
    prefers: str = ""
    avoids: str = "xl"
    autoencoder: str = ""
    autoencoder_dims: int = 2


@dataclass(frozen=True)
class ComputeShape:
    """The published constants the memory estimate's compute formula needs
    (:func:`sdplan.core.planning.estimate.compute_bytes`).

    Attributes:
        kind: ``dit`` (tokens = latent cells / 4 + text tokens) or ``unet`` (tokens = latent
            cells / ``tokens``).
        heads: attention heads of the widest attention.
        width: the hidden width (DiT) or the first level's channels (UNet).
        tokens: DiT: the text tokens; UNet: the latent divisor of its widest attention.
        te_tokens: the tokens each encoder of its ``te`` runs at once (None: each encoder's own).
        scale: image pixels per latent cell where a variant's autoencoder is not the family's
            (:attr:`Family.vae_scale`): Wan 2.2 TI2V-5B's Wan 2.2 autoencoder, 16; None: the
            family's.
    """

    kind: str
    heads: int
    width: int
    tokens: int
    te_tokens: int | None = None
    scale: int | None = None


@dataclass(frozen=True)
class DiffusionTensors:
    """What a detection rule sees of a model set.

    Attributes:
        shapes: diffusion tensor name (without ``model.diffusion_model.``) -> shape.
        llm_names: the ``llm`` text encoder's tensor names, its vision tower's included (for the
            evidence).
        metadata_families: the files' ``sdplan.family`` metadata values (scaled-down models).
        encoders: the text encoders among the files (``clip_l``, ``clip_g``, ...).
    """

    shapes: Mapping[str, tuple[int, ...]]
    llm_names: tuple[str, ...] = ()
    metadata_families: tuple[str, ...] = ()
    encoders: frozenset[str] = frozenset()


#: A rule's answer: ``(variant or None, evidence lines)``.
Detection = tuple["str | None", tuple[str, ...]]
#: A detection rule.
Rule = Callable[[DiffusionTensors], "Detection | None"]
#: A LoRA rule: the file's tensor names and their shapes -> True when it adapts the family.
LoraRule = Callable[[Sequence[str], Mapping[str, tuple[int, ...]]], bool]


@dataclass(frozen=True)
class Family:
    """One model family's declaration (module docstring).

    Attributes:
        name: the family's name as files, profiles and pictures record it (``flux``).
        title: its name for people (``FLUX.1``).
        detect: the rule: :class:`DiffusionTensors` -> :data:`Detection` or None.
        lora_rule: LoRA tensor names and shapes -> True when the file adapts this family
            (None: no LoRA file is told to be this family's).
        modules: the modules a run places (``diffusion``, ``te``, ``vae``).
        files: the accepted sets of model-file keys (sd-cli's flags without dashes): a run
            needs every key of one of them (``("model",)``: one checkpoint file).
        options: the generation options its pipeline honours
            (:data:`sdplan.core.families.options.OPTIONS` names); any other option set away
            from its default is refused by name before anything loads.
            ``variant_options``: a variant's own (replacing the family's); ``variant_needs``:
            per variant, the options it cannot run without and why (a request without one
            is refused by name before anything loads).
        sampling: ``discrete`` (k-diffusion samplers over a discrete noise schedule) or
            ``flow`` (flow matching); the sampler and scheduler names it runs follow
            (:func:`sdplan.core.sampling.names.samplers_for`, ``schedulers_for``).
        defaults: sd-cli's settings for it; ``variant_defaults`` per variant.
        sizes: trained image sizes ``(width, height)``, the default first.
        size_rule: ``unet`` (VAE factor times 2^(levels - 1)), ``patch`` (twice the
            autoencoder's factor) or ``patch8`` (16 pixels: the pipeline takes the latent at
            1/8 whatever the autoencoder).
        compute: estimate constants (:class:`ComputeShape`); ``variant_compute`` per variant.
        companions: library companions; ``variant_companions`` per variant.
        latent_format: the latent space's name for previews
            (:data:`sdplan.core.sampling.preview.PROJECTIONS`).
        lora_names: the LoRA alias table its weights take (``sd``, ``flux``, ``generic``;
            :func:`sdplan.core.modelfiles.lora_names.aliases_for`).
        prediction: a UNet's default prediction (``eps``, ``v``); None for flow models.
        unet_heads: a UNet's ``(heads, head width)`` default (one of them None).
        ays_levels: the Align Your Steps table its ``ays`` scheduler uses (``sd15``,
            ``sdxl``).
        clip_pad: the CLIP tokenizer's pad token (``eos``, or ``zero`` for OpenCLIP).
        vae_scale: image pixels per latent pixel as sd-cli tiles its autoencoder (8; FLUX.2's
            packs 2x2 latents: 16).
        pipeline: ``"module:function"`` of its generation (None: recognised, not run).
        refusal: why a recognised family is not run (with ``pipeline`` None).
        dry_run: ``"module:function"`` measuring its compute buffers (None: formulas only).
        parallel_cfg: sdplan's engine runs ``--backend cfg=DEVICE`` for it (the unconditional
            pass on the device's copy of the diffusion model at the same time;
            :mod:`sdplan.core.pipelines.stages.parallel_cfg`); False: its passes run one
            after another and the plan says so.
        work: ``"module:function"`` counting the work of its graphs for the time prediction
            (:mod:`sdplan.core.pipelines.work`; None: the prediction's formula, said in its notes).
        fitted_compute: the engine's fitted compute figures cover it
            (:mod:`sdplan.core.planning.engine_compute`).
        vision_refs: its LLM encoder's vision tower reads the reference pictures (Qwen-Image
            Edit); otherwise a vision tower in the encoder's file is never loaded (FLUX.2 dev:
            sd-cli's ``LLMEmbedder`` without vision).
        file_check: ``"module:function"`` taking the model files (sd-cli's flag keys ->
            paths) and raising ``ModelFileError`` for files that do not fit together (a Wan DiT
            and an autoencoder of other latent channels), from their headers, before anything
            loads (None: the pipeline's own checks when it loads).
        llm_layers: the hidden states of its LLM text encoder the pipeline reads, in
            stable-diffusion.cpp's ``out_layers`` numbering (``LLMEmbedder`` in its
            ``conditioner.hpp``): ``k`` is the state after ``k`` blocks; a negative ``k``
            counts as transformers' ``hidden_states[k]`` (-1: the final normed state, -2: the
            state after all blocks but the last). Empty: the final normed state (every block
            runs). The one source of the pipelines' out layers and of the plan's ``te``
            blocks (:meth:`llm_blocks_read`): blocks after the last state read are neither
            loaded by sd-cli (its graph does not use them) nor by sdplan's engine, so the plan
            does not count them. FLUX.2 klein: 9, 18, 27; FLUX.2 dev: 10, 20, 30; Z-Image:
            -2; Qwen-Image: the final state.
        text_width: the DiT tensors (either naming, without ``model.diffusion_model.``) whose
            last dimension is the width of the text states it takes: its LLM encoder's hidden
            width times the states it reads (:attr:`llm_layers`; one when empty). A ``--llm``
            of another width, or without a state it reads, is refused from the headers before
            anything loads (:func:`sdplan.core.modelfiles.file_sets.check_companions`); empty:
            not checked. Z-Image: ``cap_embedder.1.weight`` (its caption width); FLUX.2 and
            Qwen-Image: ``txt_in.weight`` (diffusers: ``context_embedder.weight``).
        llm_widths: the LLM encoders it is published with, by hidden width
            (``{2560: "Qwen3-4B"}``), named in that refusal.
    """

    name: str
    title: str
    detect: Rule
    files: tuple[tuple[str, ...], ...]
    options: frozenset[str]
    sampling: str
    defaults: Defaults
    size_rule: str
    latent_format: str
    companions: Companions
    lora_rule: LoraRule | None = None
    modules: tuple[str, ...] = ("diffusion", "te", "vae")
    variant_defaults: Mapping[str, Defaults] = field(default_factory=dict)
    sizes: tuple[tuple[int, int], ...] = ()
    compute: ComputeShape | None = None
    variant_compute: Mapping[str, ComputeShape] = field(default_factory=dict)
    variant_companions: Mapping[str, Companions] = field(default_factory=dict)
    variant_options: Mapping[str, frozenset[str]] = field(default_factory=dict)
    variant_needs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    lora_names: str = "generic"
    prediction: str | None = None
    unet_heads: tuple[int | None, int | None] | None = None
    ays_levels: str = "sd15"
    clip_pad: str = "eos"
    vae_scale: int = 8
    pipeline: str | None = None
    refusal: str = ""
    dry_run: str | None = None
    work: str | None = None
    parallel_cfg: bool = False
    fitted_compute: bool = False
    vision_refs: bool = False
    file_check: str | None = None
    llm_layers: tuple[int, ...] = ()
    text_width: tuple[str, ...] = ()
    llm_widths: Mapping[int, str] = field(default_factory=dict)

    def check_files(self, files: Mapping[str, Sequence[str]]) -> None:
        """Run the family's :attr:`file_check` on ``files`` (sd-cli's flag keys -> paths), where
        it has one.

        Raises:
            ModelFileError: as the check raises it, naming the file and its flag.
        """
        if self.file_check is not None:
            module, _, func = self.file_check.partition(":")
            getattr(importlib.import_module(module), func)(files)

    def defaults_for(self, variant: str | None) -> Defaults:
        """sd-cli's settings for ``variant`` (the family's when it has none of its own)."""
        return self.variant_defaults.get(variant or "", self.defaults)

    def compute_for(self, variant: str | None) -> ComputeShape | None:
        """The estimate constants of ``variant`` (the family's when it has none)."""
        return self.variant_compute.get(variant or "", self.compute)

    def companions_for(self, variant: str | None) -> Companions:
        """The library companions of ``variant`` (the family's when it has none)."""
        return self.variant_companions.get(variant or "", self.companions)

    def honours(self, option: str, variant: str | None = None) -> bool:
        """True when the pipeline honours generation option ``option`` (for ``variant``: its
        own options where it has them, the family's otherwise)."""
        return option in self.variant_options.get(variant or "", self.options)

    def needs_for(self, variant: str | None) -> Mapping[str, str]:
        """The options ``variant`` cannot run without: option -> why (none for most)."""
        return self.variant_needs.get(variant or "", {})

    def llm_out_layers(self, n_blocks: int) -> tuple[int, ...]:
        """The LLM states the pipeline reads (:attr:`llm_layers`) for an encoder of
        ``n_blocks`` blocks, as positive ``out_layers`` (1..``n_blocks`` + 1, the last the
        final normed state). Raises ValueError for a state the encoder does not have."""
        out = tuple((n_blocks + 1 if k == -1 else n_blocks + 1 + k) if k < 0 else k
                    for k in self.llm_layers or (-1,))
        bad = [k for k, v in zip(self.llm_layers or (-1,), out, strict=True) if not 1 <= v <= n_blocks + 1]
        if bad:
            raise ValueError(f"{self.title} reads LLM states {list(bad)}; the encoder has {n_blocks} blocks")
        return out

    def llm_blocks_read(self, n_blocks: int) -> int:
        """How many leading blocks of an ``n_blocks``-block LLM encoder the pipeline runs
        (the last state it reads, :meth:`llm_out_layers`; at most ``n_blocks``). Raises
        ValueError as :meth:`llm_out_layers`."""
        return min(max(self.llm_out_layers(n_blocks)), n_blocks)

    @property
    def runs(self) -> bool:
        """True when the engine generates with this family."""
        return self.pipeline is not None
