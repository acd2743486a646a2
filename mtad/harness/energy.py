"""Energy of the generation loop with codecarbon (model loading and scoring stay outside).

:class:`EnergyMeter` does codecarbon's slow parts (import, hardware probing) in ``prepare()``,
before the timed region, so that ``start()``/``stop()`` around generation cost milliseconds. The
result records *how* energy was measured, because on a machine without RAPL (like our CI boxes)
the CPU figure is a load-based estimate, not a measurement.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from mtad.runs.folder import J_PER_KWH

if TYPE_CHECKING:  # the GPU check imports this module's NVML helpers without Hydra
    from codecarbon.emissions_tracker import BaseEmissionsTracker

    from mtad.harness.config import EnergyConfig

# codecarbon's CPU modes -> what they mean for the reader of a result.
CPU_MODES = {
    "intel_rapl": "rapl",
    "windows_emi": "rapl",
    "intel_power_gadget": "power_gadget",
    "cpu_load": "load_estimate",
    "constant": "tdp_estimate",
}


def nvml_missing_warning(device: str) -> str:
    return (
        f"runtime.device={device} but codecarbon measured no GPU (NVML missing or failing): "
        "gpu_kwh is 0 and J/token leaves the GPU out"
    )


def cuda_uuid(index: int) -> str:
    """The UUID of CUDA device ``index`` as this process numbers it (``CUDA_VISIBLE_DEVICES``
    applied), in NVML's spelling (``GPU-<hex>``): the one name of a GPU that CUDA and NVML
    share. NVML numbers every GPU of the host in PCI order and ignores
    ``CUDA_VISIBLE_DEVICES``, so a CUDA index is not an NVML index (SLURM's
    ``CUDA_VISIBLE_DEVICES=2,3`` makes NVML's GPUs 2 and 3 this job's ``cuda:0`` and
    ``cuda:1``)."""
    import torch

    raw = str(torch.cuda.get_device_properties(index).uuid)
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def nvml_index(pynvml: Any, uuid: str) -> int:
    """NVML's index of the GPU named ``uuid`` (a MIG slice: of the GPU it is part of, which is
    what codecarbon meters)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError:
        if not uuid.startswith("GPU-"):
            raise
        # torch prints a MIG slice's UUID without its prefix too
        uuid = "MIG-" + uuid.removeprefix("GPU-")
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    if uuid.startswith("MIG-"):
        handle = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    return int(pynvml.nvmlDeviceGetIndex(handle))


def nvml_gpu_ids(cuda_ids: list[int]) -> tuple[list[int], list[str]]:
    """NVML indices and UUIDs of the CUDA devices ``cuda_ids``, matched by UUID.

    codecarbon is given these NVML indices, not the UUIDs: its UUID matching (3.3.2,
    ``GPU._get_gpu_ids``) strips ``"MIG-"`` with ``str.lstrip``, which drops the ``G`` of
    ``GPU-...`` too, so a full UUID never matches and the GPU would silently go unmetered.
    Raises when NVML or a GPU's UUID is unavailable."""
    import pynvml

    uuids = [cuda_uuid(i) for i in cuda_ids]
    pynvml.nvmlInit()
    try:
        return [nvml_index(pynvml, u) for u in uuids], uuids
    finally:
        pynvml.nvmlShutdown()


class EnergyMeter:
    """Wraps one codecarbon tracker; ``tracker: none`` makes every call a no-op.

    ``device`` is ``runtime.device`` and ``gpu_ids`` the CUDA indices of the GPUs the job's
    models occupy: codecarbon meters those only (by default it meters every GPU of the host, a
    neighbour's job included), found in NVML by UUID (:func:`nvml_gpu_ids`). A GPU run that
    codecarbon cannot meter (no NVML) is recorded as ``gpu_mode: none`` with a ``warning``, not
    as a run whose GPU used no energy; GPUs NVML has but that cannot be matched by UUID are
    metered by their CUDA index, with a ``warning`` that it may name another GPU.
    """

    def __init__(
        self, cfg: EnergyConfig, device: str = "cpu", gpu_ids: list[int] | None = None
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.gpu_ids = gpu_ids
        self.nvml_ids: list[int] | None = None  # what codecarbon meters
        self.gpu_uuids: list[str] | None = None
        self.id_warning: str | None = None
        self.tracker: BaseEmissionsTracker | None = None
        self.init_s = 0.0

    @property
    def enabled(self) -> bool:
        return self.cfg.tracker != "none"

    def prepare(self) -> None:
        if not self.enabled:
            return
        start = time.perf_counter()
        # Here, timed (init_s): energy=none runs never import codecarbon, which takes seconds.
        from codecarbon import EmissionsTracker, OfflineEmissionsTracker

        # Its import sets INFO and its constructor logs before applying log_level.
        logging.getLogger("codecarbon").setLevel(self.cfg.log_level.upper())

        common: dict[str, Any] = {
            "save_to_file": False,
            "log_level": self.cfg.log_level,
            "measure_power_secs": self.cfg.measure_power_secs,
            "tracking_mode": self.cfg.tracking_mode,
            "allow_multiple_runs": True,  # sweeps in parallel (joblib) run several trackers
        }
        if self.gpu_ids:
            common["gpu_ids"] = self._nvml_ids()
        if self.cfg.tracker == "offline":
            self.tracker = OfflineEmissionsTracker(
                country_iso_code=self.cfg.country_iso_code, **common
            )
        else:
            self.tracker = EmissionsTracker(**common)
        # Hardware probing (cached per process by codecarbon) otherwise happens in start().
        ready = getattr(self.tracker, "_ensure_hardware_ready", None)
        if callable(ready):
            ready()
        self.init_s = time.perf_counter() - start

    def _nvml_ids(self) -> list[int]:
        """NVML indices of ``gpu_ids``; the CUDA indices themselves, with a warning, when NVML
        runs but the UUIDs do not match (without NVML nothing is metered: ``gpu_mode: none``)."""
        try:
            self.nvml_ids, self.gpu_uuids = nvml_gpu_ids(list(self.gpu_ids or []))
        except Exception as err:  # noqa: BLE001 - recorded; codecarbon then finds NVML or not
            self.nvml_ids = list(self.gpu_ids or [])
            self.id_warning = (
                f"GPUs {self.gpu_ids} not matched to NVML by UUID ({type(err).__name__}: "
                f"{err}); metering NVML indices {self.nvml_ids}, which under "
                "CUDA_VISIBLE_DEVICES may be another job's GPUs"
            )
        return self.nvml_ids

    def start(self) -> None:
        if self.tracker is not None:
            self.tracker.start()

    def stop(self, new_tokens: int) -> dict[str, Any]:
        """Stop measuring; the ``energy`` block of metrics.json."""
        if self.tracker is None:
            return {"tracker": "none"}
        self.tracker.stop()
        data = getattr(self.tracker, "final_emissions_data", None)
        if data is None:  # codecarbon swallows its own errors; say so rather than guess
            return {"tracker": self.cfg.tracker, "error": "codecarbon returned no data"}
        kwh = float(data.energy_consumed)
        return {
            "tracker": self.cfg.tracker,
            "kwh": kwh,
            "joules": kwh * J_PER_KWH,
            "j_per_token": kwh * J_PER_KWH / new_tokens if new_tokens else None,
            "cpu_kwh": float(data.cpu_energy),
            "gpu_kwh": float(data.gpu_energy),
            "ram_kwh": float(data.ram_energy),
            "cpu_power_w": float(data.cpu_power),
            "gpu_power_w": float(data.gpu_power),
            "ram_power_w": float(data.ram_power),
            "duration_s": float(data.duration),
            "emissions_kg": float(data.emissions),
            "country_iso_code": data.country_iso_code,
            "tracking_mode": data.tracking_mode,
            **self.modes(),
            "init_s": self.init_s,
        }

    def close(self) -> None:
        """Stop a started tracker without reporting (the run failed)."""
        if self.tracker is not None and getattr(self.tracker, "_start_time", None) is not None:
            self.tracker.stop()

    def modes(self) -> dict[str, Any]:
        """How each component was measured: ``cpu_mode`` (rapl / load_estimate / ...),
        ``gpu_mode`` (nvml or none) and ``ram_mode`` (always an estimate), plus codecarbon's
        own hardware descriptions."""
        hardware = list(getattr(self.tracker, "_hardware", []) or [])
        cpu_mode, gpu_mode, ram_mode = "none", "none", "none"
        for hw in hardware:
            kind = type(hw).__name__
            if kind == "CPU":
                raw = str(getattr(hw, "_mode", "unknown"))
                cpu_mode = CPU_MODES.get(raw, raw)
            elif kind == "GPU":
                gpu_mode = "amdsmi" if "amd" in hw.description().lower() else "nvml"
            elif kind == "RAM":
                ram_mode = "estimate"
            elif kind in ("AppleSiliconChip", "Raspberry"):
                cpu_mode = kind.lower()
        modes: dict[str, Any] = {
            "cpu_mode": cpu_mode,
            "gpu_mode": gpu_mode,
            "ram_mode": ram_mode,
            "hardware": [hw.description() for hw in hardware],
            "gpu_ids": self.gpu_ids,
            "gpu_uuids": self.gpu_uuids,
            "nvml_gpu_ids": self.nvml_ids,
        }
        if gpu_mode == "none" and self.device.startswith("cuda"):
            modes["warning"] = nvml_missing_warning(self.device)
        elif self.id_warning is not None:
            modes["warning"] = self.id_warning
        return modes
