"""Shared fixtures of the suite's own tests."""

import os

# One OpenBLAS thread for NumPy, here (before NumPy is imported) and in every process the
# tests start, unless OPENBLAS_NUM_THREADS says otherwise: the suite's matrices are tiny,
# and OpenBLAS's idle threads spin after each call (measured: the suite's CPU 113 s with
# two threads, 89 s with one). tox.ini sets the same for each certification.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# pytester's in-process runs restore sys.modules afterwards, and a C extension such as
# NumPy cannot be loaded twice in one process: import the runner (and so NumPy) here,
# before any in-process run, now that the plugin alone imports nothing.
import attention_conformance.pytest_cases  # noqa: E402,F401
import pytest  # noqa: E402

# No test here is a Hypothesis test, but Hypothesis' pytest plugin imports all of
# Hypothesis when a session ends (~0.6 s of CPU): keep it out of the pytest runs that the
# tests start (they inherit this environment).
os.environ["PYTEST_ADDOPTS"] = " ".join(
    filter(None, [os.environ.get("PYTEST_ADDOPTS"), "-p no:hypothesispytest"]))

pytest_plugins = ["pytester"]

#: the private folder (removed at the end) of the compiled modules of the processes the
#: tests start, when PYTHONDONTWRITEBYTECODE would have them compile every module anew
_PYCACHE = pytest.StashKey[str]()


def pytest_configure(config):
    """Under PYTHONDONTWRITEBYTECODE (and no PYTHONPYCACHEPREFIX), every process a test
    starts (hundreds: each certification is three) compiled the package and the test
    adapters from source, ~0.07 CPU s each: the processes this session starts (its xdist
    workers included) write and read their compiled modules in a private temporary
    folder instead, removed when the session ends; nothing is written into the tree."""
    if hasattr(config, "workerinput") or not os.environ.get("PYTHONDONTWRITEBYTECODE") \
            or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    import tempfile

    config.stash[_PYCACHE] = tempfile.mkdtemp(prefix="attention-conformance-pycache-")
    os.environ["PYTHONPYCACHEPREFIX"] = config.stash[_PYCACHE]
    del os.environ["PYTHONDONTWRITEBYTECODE"]


def pytest_unconfigure(config):
    folder = config.stash.get(_PYCACHE, None)
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        del os.environ["PYTHONPYCACHEPREFIX"]
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


@pytest.fixture(scope="session")
def worked_examples_spec(tmp_path_factory):
    """A spec folder of the worked examples alone (their golden data, the schema and the
    tolerances): the cases folder, for the tests that certify in a fresh process and
    select a few worked examples, so that they do not collect the whole spec."""
    import shutil
    from pathlib import Path

    from attention_conformance.golden import store as golden_store

    root = Path(__file__).resolve().parent.parent / "spec"
    spec = tmp_path_factory.mktemp("worked-examples") / "spec"
    (spec / "cases").mkdir(parents=True)
    (spec / "golden").mkdir()
    for name in ("schema.json", "tolerances.yaml", "cases/worked_examples.yaml",
                 "golden/worked_examples.npz"):
        shutil.copy(root / name, spec / name)
    golden_store.write_manifest(spec / "golden")
    return spec / "cases"


def pytest_collection_modifyitems(config, items):
    """The tests marked `scale` (minutes each) run only when a run selects them by
    marker (pytest -m scale; tox -e scale): `pytest tests` stays fast."""
    if "scale" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="the scale profile's slow checks: pytest -m scale (tox -e scale)")
    for item in items:
        if item.get_closest_marker("scale"):
            item.add_marker(skip)
