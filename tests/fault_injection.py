"""A Hydra callback for tests: one job of a sweep fails at generation time.

Not production code and not imported by the harness: a test adds it on the command line,
with ``tests/`` on ``PYTHONPATH``::

    python run.py -m ... +hydra.callbacks.inject._target_=fault_injection.FailAtGeneration \\
        +hydra.callbacks.inject.method=sps

For the jobs whose ``method.name`` is ``method``, the text generator raises a ``RuntimeError``
shaped like a CUDA out-of-memory error once the models are loaded (at the warm-up generation);
the other jobs are untouched. ``on_job_end`` puts the generator back, so in-process sweeps (the
basic launcher) run the next job normally.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

MESSAGE = "CUDA out of memory. Tried to allocate 20.00 GiB (injected by tests/fault_injection.py)"


class FailAtGeneration(Callback):
    def __init__(self, method: str) -> None:
        self.method = method
        self.saved: Any = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.method.name != self.method:
            return
        from mtad.tasks import generator

        self.saved = generator.TextGenerator.__call__

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError(MESSAGE)

        generator.TextGenerator.__call__ = broken  # type: ignore[method-assign]

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.saved is not None:
            from mtad.tasks import generator

            generator.TextGenerator.__call__ = self.saved  # type: ignore[method-assign]
            self.saved = None


class _FullDiskOS:
    """``os`` as :mod:`mtad.runs.atomic` (every file the harness writes) sees it on a full
    disk: ``fsync`` of a written file fails with ENOSPC (a write-back failure, as the kernel
    reports it), all else is ``os``."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def fsync(self, fd: int) -> None:
        import errno

        raise OSError(errno.ENOSPC, self._real.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class FullDisk(Callback):
    """The results disk is full once the run writes its result folder (after the work)::

    +hydra.callbacks.disk._target_=fault_injection.FullDisk
    """

    def __init__(self) -> None:
        self.saved: Any = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from mtad.runs import atomic

        self.saved = atomic.os
        atomic.os = _FullDiskOS(atomic.os)  # type: ignore[assignment]

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.saved is not None:
            from mtad.runs import atomic

            atomic.os = self.saved  # type: ignore[assignment]
            self.saved = None


class SlowGeneration(Callback):
    """Every generation (warm-up included) waits ``seconds`` first: a window in which a test can
    interrupt a run mid-generation::

        +hydra.callbacks.slow._target_=fault_injection.SlowGeneration \\
        +hydra.callbacks.slow.seconds=1

    With ``SLOW_GENERATION=off`` in the environment it waits for nothing: a test reruns the
    very command it interrupted, at full speed.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.saved: Any = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        import os
        import time

        if os.environ.get("SLOW_GENERATION") == "off":
            return

        from mtad.tasks import generator

        self.saved = real = generator.TextGenerator.__call__
        seconds = self.seconds

        def slow(*args: Any, **kw: Any) -> Any:
            time.sleep(seconds)
            return real(*args, **kw)

        generator.TextGenerator.__call__ = slow  # type: ignore[method-assign]

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.saved is not None:
            from mtad.tasks import generator

            generator.TextGenerator.__call__ = self.saved  # type: ignore[method-assign]
            self.saved = None
