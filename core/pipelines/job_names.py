"""The names of the engine jobs of image generation, as the engine process calls them
(``"module:function"``, :class:`sdplan.core.runtime.process.Engine`).

They live apart from the jobs (:mod:`sdplan.core.pipelines.jobs`,
:mod:`sdplan.core.pipelines.compute`, which re-export them): a caller that drives an engine
child process names a job without importing what runs it (numpy, the native module).
"""

from __future__ import annotations

__all__ = ["GENERATE_JOB", "INVENTORY_JOB", "COMPUTE_JOB", "WORK_JOB", "SERVE_JOB", "LOADED_JOB", "RELEASE_JOB"]

#: The job that generates images (:func:`sdplan.core.pipelines.jobs.generate_job`).
GENERATE_JOB = "sdplan.core.pipelines.jobs:generate_job"
#: The job that lists the engine process's devices (:func:`sdplan.core.pipelines.jobs.inventory_job`).
INVENTORY_JOB = "sdplan.core.pipelines.jobs:inventory_job"
#: The job that measures compute buffers by a dry run (:func:`sdplan.core.pipelines.compute.compute_job`).
COMPUTE_JOB = "sdplan.core.pipelines.compute:compute_job"
#: The job that counts the work of a generation's graphs (:func:`sdplan.core.pipelines.work.work_job`).
WORK_JOB = "sdplan.core.pipelines.work:work_job"
#: The job a server runs per request: generation with the loaded pipeline's memory and
#: whether it was loaded for it (:func:`sdplan.core.pipelines.served.serve_job`).
SERVE_JOB = "sdplan.core.pipelines.served:serve_job"
#: The memory of the engine process's loaded pipeline (:func:`sdplan.core.pipelines.served.loaded_job`).
LOADED_JOB = "sdplan.core.pipelines.served:loaded_job"
#: Close the loaded pipeline, measuring what it freed (:func:`sdplan.core.pipelines.served.release_job`).
RELEASE_JOB = "sdplan.core.pipelines.served:release_job"
