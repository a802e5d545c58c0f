"""Planting one bug in the tiled adapter (tests/known_good/tiled.py), for the
tests/known_bad/tiled_*.py adapters: each subclasses TiledPlanted and overrides one
method of the tiled kernel (a tile's range, mask, bias, online-softmax step, split-KV
merge or backward step) with the buggy version a real kernel shipped.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

_GOOD = Path(__file__).resolve().parent.parent / "known_good" / "tiled.py"
_NAME = "known_good_tiled"


def _load_good():
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, _GOOD)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_NAME]


good = _load_good()
Tiled = good.Tiled
NEG_INF = good._NEG_INF
swap = good._swap


class TiledPlanted(Tiled):
    """The tiled adapter (tiles of 16 x 16) with one planted bug; named bad-<kebab name>."""

    block_q = 16
    block_k = 16

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name = "bad-" + re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()
