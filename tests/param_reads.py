"""``ParamReads``: a params mapping that records the dotted key of each value code reads from it
(``benchmark.serving.cpu_concurrency``; a section read whole records its name). Tests that check a stage or the
server depends on every params key its code reads (tests/test_dvc_stage_params.py, tests/test_deploy_ready.py)
hand code one and compare what it recorded with dvc.yaml's params or the server's digest.
"""

from __future__ import annotations

from typing import Any


class ParamReads(dict):
    """``ParamReads(data, seen)``: ``data`` as a dict whose ``[]`` and ``get`` add each key read to the set ``seen``,
    dotted below the top level (a nested mapping comes back as a ``ParamReads`` of its own); a ``get`` of a missing
    key records it too."""

    def __init__(self, data: dict, seen: set[str], where: str = ""):
        super().__init__(data)
        self._seen, self._where = seen, where

    def _key(self, k: Any) -> str:
        return f"{self._where}.{k}" if self._where else str(k)

    def _wrap(self, k: Any, v: Any) -> Any:
        key = self._key(k)
        self._seen.add(key)
        return ParamReads(v, self._seen, key) if isinstance(v, dict) else v

    def __getitem__(self, k: Any) -> Any:
        return self._wrap(k, super().__getitem__(k))

    def get(self, k: Any, default: Any = None) -> Any:
        if k in self:
            return self._wrap(k, super().get(k))
        self._seen.add(self._key(k))
        return default


def sections(seen: set[str]) -> set[str]:
    """The top-level sections of the dotted keys in ``seen``."""
    return {k.split(".", 1)[0] for k in seen}
