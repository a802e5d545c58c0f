"""The package as installed: one import root, the spec found without a checkout's help,
and a pytest plugin that costs other projects nothing until --backend is given."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap

import attention_conformance
from attention_conformance.model import folder as spec_folder
from attention_conformance.model.folder import SpecFolder

INERT_CHECK = textwrap.dedent("""
    import sys

    def test_the_plugin_loaded_nothing_but_itself():
        assert "attention_conformance.plugin" in sys.modules      # it was loaded ...
        loaded = sorted(m for m in sys.modules if m.startswith("attention_conformance"))
        assert loaded == ["attention_conformance", "attention_conformance.options",
                          "attention_conformance.plugin"], loaded    # and its options' table
        for heavy in ("numpy", "yaml", "jsonschema", "ml_dtypes"):
            assert heavy not in sys.modules, heavy                 # ... and nothing else
""")


def test_the_plugin_is_inert_without_backend(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(INERT_CHECK)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"     # only our plugin: others import numpy
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "attention_conformance.plugin", str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_plugin_registers_its_options_without_backend(tmp_path):
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "attention_conformance.plugin",
                             "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    for option in ("--backend", "--spec-dir", "--profile", "--case-timeout", "--report"):
        assert option in result.stdout, option


def test_the_version_is_single_sourced():
    assert importlib.metadata.version("attention-conformance") == attention_conformance.__version__


def test_the_spec_is_found_without_an_override():
    found = spec_folder.packaged_spec_dir()
    assert (found / "cases" / "worked_examples.yaml").is_file()
    assert (found / "golden" / "SHA256SUMS").is_file()
    assert (found / "schema.json").is_file() and (found / "tolerances.yaml").is_file()


def test_the_override_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_CONFORMANCE_SPEC", str(tmp_path))
    assert SpecFolder.default().root == tmp_path.resolve()
    monkeypatch.delenv("ATTENTION_CONFORMANCE_SPEC")
    assert SpecFolder.default().root == spec_folder.packaged_spec_dir()


def test_every_module_lives_under_one_import_root():
    """Importing every module of the suite brings in no generically named package."""
    import pkgutil
    for info in pkgutil.iter_modules(attention_conformance.__path__, "attention_conformance."):
        if info.name != "attention_conformance.__main__":
            importlib.import_module(info.name)
    importlib.import_module("attention_conformance.backends.numpy")
    for generic in ("conformance", "backends", "spec"):
        assert generic not in sys.modules, generic


def _tox_settings() -> dict:
    """tox.ini's [testenv] set_env, which every environment reads."""
    import configparser
    from pathlib import Path

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).resolve().parents[2] / "tox.ini")
    settings = dict(line.split("=", 1) for line in tox["testenv"]["set_env"].splitlines()
                    if "=" in line and not line.strip().startswith("#"))
    return {k.strip(): v.strip() for k, v in settings.items()}


def test_tox_caches_compiled_modules_outside_the_checkout():
    """docs/running.md, "compiled modules": tox's environments compile the editable package once,
    into .tox, rather than in every process (PYTHONDONTWRITEBYTECODE) or into the tree."""
    settings = _tox_settings()
    assert settings.get("PYTHONPYCACHEPREFIX") == "{work_dir}{/}pycache", settings
    assert "PYTHONDONTWRITEBYTECODE" not in settings


def test_numpy_gets_one_openblas_thread_unless_the_caller_says_otherwise():
    """docs/running.md, "one OpenBLAS thread": every tox environment defaults it to 1 and keeps the
    caller's; so do the suite's own tests, for every process they start (tests/conftest.py)."""
    assert _tox_settings().get("OPENBLAS_NUM_THREADS") == "{env:OPENBLAS_NUM_THREADS:1}"
    assert os.environ.get("OPENBLAS_NUM_THREADS"), "tests/conftest.py sets it"
    seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get("
                           "'OPENBLAS_NUM_THREADS'))"], capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == os.environ["OPENBLAS_NUM_THREADS"]
