"""docs/adding-a-backend.md's ring attention, run as an outside author would: the guide's
adapter, saved to a file and loaded by path, certified on the sharded cases (its ranks
forked from this process): every forward case passes, the rest are unsupported."""

import re
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from attention_conformance.backend.in_process import InProcess  # noqa: E402
from attention_conformance.backend.resolve import load_backend  # noqa: E402
from attention_conformance.checking.verdict import verdict_of  # noqa: E402
from attention_conformance.golden.store import GoldenStore  # noqa: E402
from attention_conformance.specs.loader import load_spec  # noqa: E402
from _ring_tests import slow_ring  # noqa: E402

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-a-backend.md"


@slow_ring
def test_the_guides_ring_certifies_on_the_sharded_cases(tmp_path):
    [code] = re.findall(r"<!-- ring example -->\n```python\n(.*?)```", GUIDE.read_text(), re.S)
    (tmp_path / "my_ring.py").write_text(code)
    backend = InProcess(load_backend(f"{tmp_path / 'my_ring.py'}:MyRing"))
    golden = GoldenStore()
    statuses = {}
    for case in (c for c in load_spec().cases if c.topic == "context_parallel"):
        for variant in case.variants:
            for dtype in case.dtypes:
                verdict = verdict_of(backend, case, variant, dtype, golden)
                statuses[f"{case.id}[{dtype}]"] = (verdict["status"], verdict["message"][:200])
    passed = [t for t, (s, _) in statuses.items() if s == "pass"]
    assert all(s in ("pass", "unsupported") for s, _ in statuses.values()), statuses
    assert all("vjp" in t or "bfloat16" in t for t, (s, _) in statuses.items()
               if s == "unsupported"), statuses
    assert len(passed) >= 10, statuses
