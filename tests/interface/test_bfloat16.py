"""docs/interface.md's bfloat16 recipes, run: each framework's block takes an
ml_dtypes.bfloat16 array to the framework's bfloat16 tensor and back, bits unchanged
(skipped where that framework is not installed)."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "interface.md"
#: the framework of each block -> (the names its block uses, the tensor's bfloat16 dtype)
FRAMEWORKS = {
    "torch": ({"torch": "torch"}, lambda m: m["torch"].bfloat16),
    "jax": ({"jnp": "jax.numpy"}, lambda m: m["jnp"].bfloat16),
    "tensorflow": ({"tf": "tensorflow"}, lambda m: m["tf"].bfloat16),
}


def recipes() -> dict[str, str]:
    return dict(re.findall(r"<!-- bfloat16: (\w+) -->\n```python\n(.*?)```", PAGE.read_text(),
                           re.S))


def test_the_page_gives_a_recipe_for_each_framework_it_can_check():
    assert set(recipes()) == set(FRAMEWORKS)


@pytest.mark.parametrize("framework", sorted(recipes()))
def test_a_recipe_round_trips_bfloat16(framework):
    names, dtype_of = FRAMEWORKS[framework]
    modules = {name: pytest.importorskip(module) for name, module in names.items()}
    x = np.array([[1.5, -2.25, 3.0e38], [0.1, -0.0, np.inf]], dtype=ml_dtypes.bfloat16)
    scope = {"np": np, "ml_dtypes": ml_dtypes, "x": x, **modules}
    exec(recipes()[framework], scope)
    assert scope["t"].dtype == dtype_of(modules)
    y = scope["y"]
    assert isinstance(y, np.ndarray) and y.dtype == np.dtype(ml_dtypes.bfloat16)
    assert y.view(np.uint16).tobytes() == x.view(np.uint16).tobytes()
