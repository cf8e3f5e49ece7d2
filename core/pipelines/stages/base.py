"""What every pipeline shares: its backends, its cancel token, its module runners, the
memory report and closing.

A pipeline (SD, Flux, a TAE, an upscaler) is a set of named
:class:`~sdplan.core.runtime.runner.ModuleRunner` objects over one
:class:`~sdplan.core.runtime.runner.BackendPool`. The pool is the caller's (the engine
process shares one between requests) or the pipeline's own, whose CPU backend uses
``n_threads`` threads and which :meth:`Pipeline.close` closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.modelfiles.lora_names import AliasTable
from sdplan.core.pipelines.stages.lora import AppliedLora, LoraState
from sdplan.core.runtime.devices import BackendManager
from sdplan.core.runtime.runner import BackendPool, CancelToken, ModulePlacement, ModuleRunner
from sdplan.core.runtime.weights import WeightFile


def module_placements(modules: Sequence[str], plan: Any = None,
                      placements: Mapping[str, ModulePlacement] | None = None) -> dict[str, ModulePlacement]:
    """Each module's placement: ``placements[m]`` when given, else the resolved ``plan``'s
    (:meth:`ModulePlacement.from_plan`), else the CPU with resident weights."""
    given = placements or {}
    return {m: given.get(m) or (ModulePlacement.from_plan(plan, m) if plan is not None
                                else ModulePlacement(("CPU",))) for m in modules}


class Pipeline:
    """Base of the pipelines (see the module docstring).

    Args:
        pool: backends by device name (None: a private pool whose CPU uses ``n_threads``).
        n_threads: CPU threads per compute (0: the backend's setting).
        cancel: a shared :class:`CancelToken` (None: a new one).
    """

    def __init__(self, pool: BackendPool | None = None, n_threads: int = 0,
                 cancel: CancelToken | None = None) -> None:
        self._own_pool = pool is None
        self.pool = pool if pool is not None else BackendPool(
            BackendManager(cpu_threads=n_threads or None))
        self.n_threads = n_threads
        self.cancel = cancel or CancelToken()
        self.runners: dict[str, ModuleRunner] = {}
        self.placements: dict[str, ModulePlacement] = {}
        #: The LoRAs in use (:meth:`set_loras`).
        self.loras = LoraState()
        #: VAE tiling of the run in progress (``--vae-tiling``; None: whole) and how the
        #: last decode ran (:class:`~sdplan.core.pipelines.stages.vae_tiles.TileRun`).
        self.vae_tiling: Any = None
        self.last_decode: Any = None

    def run_info(self) -> dict[str, Any]:
        """What the last run adds to the picture's record: ``vae_tiles`` (the tiles the last
        decode ran in, and whether they were a retry) when it decoded in tiles."""
        run = self.last_decode
        return {"vae_tiles": run.to_json()} if run is not None and run.tile else {}

    def new_runner(self, name: str, model: Any, weights: WeightFile,
                   placement: ModulePlacement) -> ModuleRunner:
        """A runner of ``model`` (a ModuleGraph) over ``weights`` placed by ``placement``,
        sharing this pipeline's pool, cancel token and threads (not registered: the caller
        stores it in :attr:`runners` under the name it reports memory by). The current
        LoRAs patching module ``name`` are applied to it."""
        runner = ModuleRunner(model, weights, placement, self.pool, self.cancel, name, self.n_threads)
        if self.loras.applied:
            self.loras.attach(name, runner)
        return runner

    def lora_aliases(self) -> AliasTable:
        """The names a LoRA may give this pipeline's weights
        (:mod:`sdplan.core.modelfiles.lora_names`); each family's pipeline defines them.

        Raises:
            SdplanError: a pipeline that takes no LoRA.
        """
        from sdplan.core.errors import SdplanError

        raise SdplanError(f"{type(self).__name__} takes no LoRA")

    def set_loras(self, loras: list[AppliedLora], mode: str = "auto") -> str | None:
        """Patch the modules with ``loras`` (``[]``: none) from the next run on, applied in
        ``mode`` (``auto``, ``immediately``, ``at_runtime``; see
        :mod:`sdplan.core.runtime.lora`). Returns the mode in use (None without LoRAs).

        Raises:
            SdplanError: an unknown mode or a patch that does not fit its weight.
        """
        return self.loras.set(loras, mode, self.runners, self.placements)

    def set_cancel(self, token: CancelToken) -> None:
        """Use ``token`` for every module from now on."""
        self.cancel = token
        for r in self.runners.values():
            r.cancel = token

    def memory(self) -> dict[str, dict[str, Any]]:
        """Per runner, per device: the bytes allocated now and at the peak of its last run
        (``{"now": DeviceMemory or None, "peak": DeviceMemory}``)."""
        return {m: {d: {"now": r.memory().get(d), "peak": pk} for d, pk in r.last_peak.items()}
                for m, r in self.runners.items()}

    def placed(self) -> dict[str, dict[str, int]]:
        """Per runner, per device: bytes of the tensors its placement puts there."""
        return {m: r.placed_bytes() for m, r in self.runners.items()}

    def close(self) -> None:
        """Free every weight buffer and graph, and the private backends. Idempotent."""
        for r in self.runners.values():
            r.release()
        self.runners.clear()
        if self._own_pool:
            self.pool.manager.close()
            self._own_pool = False

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
