"""The session's estimates: the plan's memory at the generation settings' size, with the
engine's dry-run compute and the prompt's LoRAs (both cached), its predicted time (cached
with the estimate: :meth:`Estimates.predicted_time`), what each residency of a module would
change, and which module sets a device's peak. The base of
:class:`~sdplan.core.session.board.BoardSession`, which holds the state read here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.timing import RunSettings, TimeReport

log = logging.getLogger(__name__)

#: Work counts the session keeps (one per files, settings, placement and tiling met last).
WORK_CACHE = 16

#: What the board's time leaves out with the hires fix on (as ``sdplan generate -v`` says).
HIRES_NOTE = ("hires fix: its second pass (sampling and decode at the hires size) and the upscale "
              "between the passes are not priced; the prediction is the first pass's")


class Estimates:
    """Estimates of a session's plan (see module docstring); the state is the subclass's."""

    inventory: Inventory
    profile: Profile | None
    plan: Plan
    fit: Any
    model_files: dict[str, list[str]]
    generation: dict[str, Any]
    notify: Callable[[str], None]
    _effects: dict[str, dict[str, dict[str, int]]]
    _lora_cache: tuple[object, dict | None]
    _compute_cache: dict[object, dict[str, int] | None]
    _work_cache: dict[object, dict[str, list[Any]] | None]
    #: The predicted time of the current estimate (False: not made yet; None: none).
    _time: TimeReport | None | bool = False
    #: ``(inventory, the same with the kept device profiles)`` of the last time prediction.
    _profiled: tuple[Inventory | None, Inventory | None] = (None, None)
    #: Puts measured device profiles on the inventory's devices for the time prediction
    #: (default: those ``sdplan devices --calibrate`` kept; devices that carry one keep it).
    time_profiles: Callable[[Inventory], Inventory] | None = None

    @property
    def placement(self) -> Placement:
        """The canonical placement of the current plan (what edits start from)."""
        return self.plan.placement

    def size(self) -> tuple[int, int, int]:
        """``(width, height, batch)`` of the generation settings (pixels; 1024 and 1 when
        unset)."""
        g = self.generation
        return (int(g.get("width") or 1024), int(g.get("height") or 1024),
                int(g.get("batch_count") or 1))

    def peak_size(self) -> tuple[int, int, int]:
        """:meth:`size` with the largest picture the run samples: the hires fix's second
        pass when it is on (:func:`~sdplan.core.session.modules.peak_size`)."""
        from sdplan.core.session.modules import peak_size

        w, h = peak_size(self.generation, self.profile.architecture if self.profile else None)
        return w, h, self.size()[2]

    # ------------------------------------------------------------------ estimates
    def frames(self) -> int:
        """The frames of the settings' video (``-M vid_gen --video-frames``), 1 for pictures."""
        g = self.generation
        try:
            return max(1, int(g.get("video_frames") or 1)) if g.get("mode") == "vid_gen" else 1
        except (TypeError, ValueError):
            return 1

    def ref_pictures(self) -> list[str]:
        """The settings' reference pictures (``ref_images``, ``-r`` each), in order
        (:func:`~sdplan.core.session.modules.ref_pictures`)."""
        from sdplan.core.session.modules import ref_pictures

        return ref_pictures(self.generation)

    def estimate(self) -> None:
        """Estimate the current plan at the size of its largest pass, a video's frames and
        the reference pictures (an LLM encoder's vision tower, the dry run's Edit graphs)
        included (``fit``; None without a profile or when the estimate cannot be made:
        ``notify`` says why)."""
        self.fit = None
        self._effects = {}
        self._time = False
        if self.profile is None:
            return
        from sdplan.core.planning.estimate import estimate_plan

        size = self.peak_size()
        try:
            self.fit = estimate_plan(self.plan, self.profile, self.inventory,
                                     width=size[0], height=size[1], batch=size[2],
                                     engine="sdplan", measured=self.measured(size),
                                     loras=self.lora_profiles(), frames=self.frames(),
                                     ref_images=len(self.ref_pictures()))
        except ValueError as exc:
            self.notify(f"estimate unavailable: {exc}")

    def time_settings(self) -> RunSettings:
        """The :class:`~sdplan.core.planning.timing.RunSettings` of the generation settings:
        :meth:`size`, ``steps`` (20 when unset), ``sampling_method`` (sd-cli's ``euler_a``
        when unset), guidance on unless ``cfg_scale`` is 1, ``threads`` (0: as the CPU
        profile was measured), a video's :meth:`frames`."""
        g = self.generation
        w, h, b = self.size()
        cfg = g.get("cfg_scale")
        return RunSettings(width=w, height=h, batch=b, steps=max(1, int(g.get("steps") or 20)),
                           sampler=str(g.get("sampling_method") or "euler_a"),
                           cfg=cfg is None or float(cfg) != 1.0,
                           threads=max(0, int(g.get("threads") or 0)), frames=self.frames())

    def profiled_inventory(self) -> Inventory:
        """The inventory with each device's measured profile (:attr:`time_profiles`, default
        :func:`~sdplan.core.runtime.profile_cache.with_cached_profiles`), kept while the
        inventory is the same."""
        if self._profiled[0] != self.inventory or self._profiled[1] is None:
            source = self.time_profiles
            if source is None:
                from sdplan.core.runtime.profile_cache import with_cached_profiles

                def source(inv: Inventory) -> Inventory:
                    return with_cached_profiles(inv, self.time_settings().threads)
            self._profiled = (self.inventory, source(self.inventory))
        assert self._profiled[1] is not None
        return self._profiled[1]

    def predicted_time(self) -> TimeReport | None:
        """Predicted seconds of the current plan at the generation settings
        (:func:`~sdplan.core.planning.timing.predict_time` with the work of the engine's own
        graphs for the open model files, as ``sdplan plan`` counts it (:meth:`work`), else by
        the formula from the profile's parameter counts (a built-in profile, no files); each
        device's measured profile, else its type's stated defaults:
        :attr:`TimeReport.profiles`), with the estimate's ``--max-vram`` segments and the model
        files' drives; made once per estimate (every edit, settings and device change
        re-estimates); with the hires fix on, the first pass's, its notes saying so. None
        without a profile or when it cannot be made (logged)."""
        if self._time is not False:
            return self._time  # type: ignore[return-value]
        self._time = None
        if self.profile is None:
            return None
        import os

        from sdplan.core.planning.timing import drive_of_files, predict_time

        paths = {m: [os.path.abspath(p) for p in ps]
                 for m, ps in drive_of_files(self.model_files).items()}
        segments = {m: list(e.segments) for m, e in (getattr(self.fit, "modules", None) or {}).items()
                    if getattr(e, "segments", ())}
        try:
            rep = predict_time(self.plan, self.profiled_inventory(), self.profile,
                               self.time_settings(), self.work(), paths, segments)
        except (SdplanError, ValueError, ZeroDivisionError) as exc:
            log.info("no time prediction: %s", exc)
            return None
        if self.peak_size()[:2] != self.size()[:2]:  # named, never priced as nothing
            rep = dataclasses.replace(rep, notes=(*rep.notes, HIRES_NOTE))
        self._time = rep
        return rep

    def work(self) -> dict[str, list[Any]] | None:
        """The work of the engine's graphs for the open files at the time settings, on the
        plan's devices (:func:`~sdplan.core.pipelines.work.count_plan` on CPU stand-ins named
        as the inventory's devices: the app touches no other device), cached per files,
        settings, placement and tiling (the last :data:`WORK_CACHE` kept); None without files
        or a count (the prediction then takes the formula)."""
        if not self.model_files:
            return None
        s = self.time_settings()
        g = self.generation
        tiling = g.get("vae_tiling") or None
        names = tuple(d.name for d in self.inventory)
        accelerators = tuple(d.name for d in self.inventory if d.type != "cpu")
        key = (repr(sorted(self.model_files.items())), s.width, s.height, s.batch, s.cfg, s.frames,
               repr(self.plan.placement), names, accelerators, repr(tiling))
        cache = self._work_cache
        if key not in cache:
            from sdplan.core.pipelines.work import count_plan
            from sdplan.core.planning.vae_tiling import VaeTiling

            try:
                vt = VaeTiling.from_json(tiling) if tiling else None
            except (SdplanError, ValueError, TypeError):
                vt = None
            cache[key] = count_plan(self.model_files, self.plan, names, width=s.width, height=s.height,
                                    batch=s.batch, cfg=s.cfg, vae_tiling=vt, frames=s.frames,
                                    accelerators=accelerators) or None
            while len(cache) > WORK_CACHE:
                cache.pop(next(iter(cache)))
        return cache[key]

    def measured(self, size: tuple[int, int, int]) -> dict[str, int] | None:
        """Compute bytes per module of sdplan's engine for the open files at ``size``
        (width, height, batch; a video's frames), by a dry run of its graphs on the CPU
        (:func:`~sdplan.core.pipelines.compute.measure_compute`; with the settings' ControlNet,
        VAE tiling and reference pictures, read from their headers as generate reads them), cached per files, size and tiling; None without files or when no dry
        run is possible."""
        if not self.model_files:
            return None
        files = dict(self.model_files)
        g = self.generation
        if g.get("control_net"):  # measured with the ControlNet's graph, as generate measures
            files["control_net"] = [str(g["control_net"])]
        tiling = g.get("vae_tiling") or None
        frames = self.frames()
        refs = self.ref_pictures()
        key = (repr(sorted(files.items())), size, repr(tiling), frames, tuple(refs))
        if key not in self._compute_cache:
            try:
                from sdplan.core.pipelines.compute import measure_compute

                self._compute_cache[key] = measure_compute(
                    files, width=size[0], height=size[1], batch=size[2],
                    vae_tiling=tiling, overrides={"video_frames": frames,
                                                  **({"ref_images": refs} if refs else {})}) or None
            except Exception as exc:  # noqa: BLE001 - the fitted figures stand in
                log.info("no dry run of the engine: %s", exc)
                self._compute_cache[key] = None
        return self._compute_cache[key]

    def lora_profiles(self) -> dict | None:
        """At-runtime LoRA bytes per module for the prompt's ``<lora:...>`` tags
        (:func:`~sdplan.core.pipelines.stages.inputs.plan_loras`, cached), or None without
        LoRAs or when they cannot be planned (``notify`` says why)."""
        from sdplan.core.pipelines.stages.inputs import plan_loras

        g = self.generation
        prompt = str(g.get("prompt") or "")
        if "<lora:" not in prompt or not self.model_files:
            return None
        key = (prompt, g.get("lora_model_dir"), g.get("lora_apply_mode"),
               repr(self.model_files), self.plan.placement)
        if self._lora_cache[0] != key:
            try:
                planned = plan_loras(prompt, str(g.get("lora_model_dir") or "."),
                                     str(g.get("lora_apply_mode") or "auto"), self.model_files,
                                     self.plan)
                self._lora_cache = (key, planned.profiles)
            except (SdplanError, OSError, ValueError) as exc:
                self.notify(f"LoRA not counted in the estimate: {exc}")
                self._lora_cache = (key, None)
        return self._lora_cache[1]

    def estimate_of(self, plan: Plan) -> Any:
        """The estimate of another ``plan`` at the settings' size (the fitted compute
        figures, no dry run), or None without a profile or when it cannot be made."""
        if self.profile is None:
            return None
        from sdplan.core.planning.estimate import estimate_plan

        w, h, b = self.size()
        try:
            return estimate_plan(plan, self.profile, self.inventory, width=w, height=h, batch=b,
                                 frames=self.frames(), ref_images=len(self.ref_pictures()))
        except ValueError:
            return None

    def residency_effects(self, module: str) -> dict[str, dict[str, int]]:
        """What each other residency of ``module`` would change: mode (``runtime``,
        ``device`` = weights in RAM on the CPU, ``disk``) -> device -> bytes its estimated
        total would drop (negative: grow). Empty without an estimate; cached per plan."""
        cached = self._effects.get(module)
        if cached is not None:
            return cached
        out: dict[str, dict[str, int]] = {}
        if self.fit is not None and self.profile is not None and module in self.profile.modules:
            cpu = next((d.name for d in self.inventory if d.type == "cpu"), None)
            current = self.plan.modules[module].params.mode
            runs_on = self.plan.modules[module].devices
            for mode in ("runtime", "device", "disk"):
                if mode == current or (mode == "device" and (cpu is None or cpu in runs_on)):
                    continue  # "in RAM" on the CPU is where it runs already
                try:
                    pl = self.placement.set_residency(module, mode,
                                                      cpu if mode == "device" else None)
                    alt = self.estimate_of(resolve(pl, self.inventory, self.profile))
                except PlanError:
                    continue
                if alt is None:
                    continue
                names = set(self.fit.devices) | set(alt.devices)
                out[mode] = {d: (self.fit.devices[d].total if d in self.fit.devices else 0)
                             - (alt.devices[d].total if d in alt.devices else 0)
                             for d in sorted(names)}
        self._effects[module] = out
        return out

    def peak_module(self, device: str) -> tuple[str, str] | None:
        """``(module, part)`` that sets ``device``'s transient peak (``staging`` or
        ``compute``), or None."""
        fit = self.fit
        if fit is None or device not in fit.devices:
            return None
        best = max(fit.modules.values(), key=lambda e: e.staging.get(device, 0)
                   + e.compute.get(device, 0), default=None)
        if best is None or not (best.staging.get(device, 0) + best.compute.get(device, 0)):
            return None
        part = "compute" if best.compute.get(device, 0) >= best.staging.get(device, 0) \
            else "staging"
        return best.module, part
