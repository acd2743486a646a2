"""Finding a run's result folder by its identity, whatever the folder's name.

A folder's name is its signature when it was written; the identity is read back from its
``config.yaml`` and ``metrics.json`` (:func:`mtad.runs.identity.identity_of`), so a run is
found by what it is. The harness asks :func:`find_complete` before it runs anything; the
paper's planner indexes a whole study once (:class:`StudyIndex`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from mtad.runs.folder import is_complete, read_config, read_metrics
from mtad.runs.identity import RunIdentity, identity_of


def stored_identity(folder: Path) -> RunIdentity | None:
    """The identity of a complete result folder (None for any other folder)."""
    if not is_complete(folder):
        return None
    metrics = read_metrics(folder)
    return identity_of(read_config(folder), metrics) if metrics is not None else None


def find_complete(study_dir: Path, identity: RunIdentity) -> Path | None:
    """The complete folder of ``identity`` under ``study_dir``: the one named by its signature,
    else one of the same method, pair and task whose stored identity is it."""
    named = study_dir / identity.signature
    if is_complete(named):
        return named
    prefix = identity.signature.rsplit("-", 1)[0]
    for folder in sorted(study_dir.glob(f"{prefix}-*")):
        found = stored_identity(folder)
        if found is not None and found.paper_key == identity.paper_key:
            return folder
    return None


class StudyIndex:
    """The complete folders of studies by identity, each study read once: by
    :attr:`~RunIdentity.paper_key` (the run itself) and by
    :attr:`~RunIdentity.setup_key` (the same run on any machine)."""

    def __init__(self) -> None:
        self._studies: dict[Path, dict[str, Any]] = {}

    def _study(self, study_dir: Path) -> dict[str, Any]:
        if study_dir not in self._studies:
            by_key: dict[str, Path] = {}
            by_setup: dict[str, list[tuple[str, dict[str, Any], Path]]] = {}
            for metrics_file in sorted(study_dir.glob("*/metrics.json")):
                identity = stored_identity(metrics_file.parent)
                if identity is None:
                    continue
                by_key.setdefault(identity.paper_key, metrics_file.parent)
                hardware_id = RunIdentity({}, identity.hardware).paper_key
                entry = (hardware_id, identity.hardware, metrics_file.parent)
                by_setup.setdefault(identity.setup_key, []).append(entry)
            self._studies[study_dir] = {"key": by_key, "setup": by_setup}
        return self._studies[study_dir]

    def find(self, study_dir: Path, identity: RunIdentity) -> Path | None:
        """The complete folder of exactly ``identity``."""
        return self._study(study_dir)["key"].get(identity.paper_key)

    def elsewhere(self, study_dir: Path, identity: RunIdentity) -> RunIdentity | None:
        """``identity`` on the machine that ran the study's runs of its device kind, when that
        machine ran it: for a planner that cannot run the device itself. One machine for all
        the runs of a kind (the one with the most complete runs), so what a plan finds this
        way is comparable."""
        kind = identity.hardware.get("device_kind")
        found = self._study(study_dir)["setup"].get(identity.setup_key, [])
        candidates = {h_id: hw for h_id, hw, _ in found if hw.get("device_kind") == kind}
        if not candidates:
            return None
        counts: Counter[str] = Counter()
        for entries in self._study(study_dir)["setup"].values():
            counts.update(h_id for h_id, hw, _ in entries if hw.get("device_kind") == kind)
        best = max(counts, key=lambda h_id: (counts[h_id], h_id))
        if best not in candidates:
            return None
        return RunIdentity(identity.setup, candidates[best])


__all__ = ["StudyIndex", "find_complete", "stored_identity"]
