"""Small settings of every method for the tests on tiny models (short blocks, narrow trees;
BiLD's fallback threshold low enough that the tiny draft drafts at all)."""

from __future__ import annotations

from typing import Any

METHOD_PARAMS: dict[str, dict[str, Any]] = {
    "ar": {},
    "sps": {"gamma": 3},
    "blockverify": {"gamma": 3},
    "mtad": {"gamma": 3, "beam_width": 3, "tau": 0.3},
    "mtjd": {"gamma": 3, "beam_width": 3},
    "specinfer": {"branching": [3, 2, 1]},
    "bild": {"fallback_threshold": 0.015, "rollback_threshold": 4.0, "max_draft": 4},
    "mmtad": {"gamma": 3, "beam_width": 3, "tau": 0.3},
}
