"""docs/adding-a-backend.md, followed as a backend author would: `new-backend` writes the
adapter package, which is certified by path, then installed into a throwaway
environment and certified by its entry point name. The guide's files are the files it
writes (and the repository's example), and its commands exist."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from _cli_support import ROOT, cli, make_spec
from attention_conformance.cli import build_parser

GUIDE = ROOT / "docs" / "adding-a-backend.md"
EXAMPLE = ROOT / "examples" / "toy_backend"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_spec(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """Step 1: attention-conformance new-backend toy toy_backend, in a folder of the user's."""
    home = tmp_path_factory.mktemp("user")
    written = cli("new-backend", "toy", "toy_backend", cwd=home)
    assert written.returncode == 0, written.stdout + written.stderr
    return home / "toy_backend"


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and "egg-info" not in str(p) and "__pycache__" not in str(p)}


def test_new_backend_writes_the_example(package):
    """The package new-backend writes from its templates is examples/toy_backend."""
    assert _files(package) == _files(EXAMPLE)
    assert set(_files(package)) == {"pyproject.toml", "src/toy_attention/__init__.py",
                                    "src/toy_attention/adapter.py"}


def test_new_backend_names_the_package_after_the_backend(tmp_path):
    assert cli("new-backend", "my-kernel", tmp_path / "k").returncode == 0
    adapter = (tmp_path / "k" / "src" / "my_kernel_attention" / "adapter.py").read_text()
    assert 'class MyKernelBackend:\n    name = "my-kernel"' in adapter
    assert 'my-kernel = "my_kernel_attention.adapter:MyKernelBackend"' in \
        (tmp_path / "k" / "pyproject.toml").read_text()
    for refused in (("my-kernel", tmp_path / "k"), ("MyKernel", tmp_path / "new")):
        result = cli("new-backend", *refused)
        assert result.returncode == 2 and "new-backend:" in result.stderr, refused
    assert not (tmp_path / "new").exists()


def test_the_guide_shows_the_example_files_as_they_are():
    text = GUIDE.read_text()
    shown = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
    assert {path for path, _ in shown} == {
        "examples/toy_backend/pyproject.toml",
        "examples/toy_backend/src/toy_attention/__init__.py",
        "examples/toy_backend/src/toy_attention/adapter.py"}
    for path, block in shown:
        assert block == (ROOT / path).read_text(), f"the guide's copy of {path} is stale"


def test_the_guide_commands_exist():
    text = GUIDE.read_text()
    parser = build_parser()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            words = shlex.split(line.split("#", 1)[0])
            while words and "=" in words[0]:          # PYTHONPATH=src ...
                words = words[1:]
            if words[:1] == ["attention-conformance"]:
                commands.append(words[1:])
    assert {c[0] for c in commands} == {"new-backend", "certify", "fuzz"}
    for command in commands:
        args, unknown = parser.parse_known_args(command)
        assert not unknown, command


def _shown(marker: str) -> list[str]:
    """The lines of the guide's text block after an HTML comment marker."""
    block = GUIDE.read_text().split(f"<!-- {marker} -->\n```text\n", 1)[1]
    return block.split("```", 1)[0].splitlines()


def test_the_guides_summary_is_a_real_runs(tmp_path):
    """Step 5's summary is what `certify toy --report reports` prints on the package's own
    spec (its hash aside): it once showed the small test spec's run (26 cases, 42 pass,
    106 unsupported, float32 0.25) in an older format."""
    shown = _shown("summary: attention-conformance certify toy --report reports")
    run = cli("certify", f"{EXAMPLE}/src/toy_attention/adapter.py:ToyBackend",
              "--report", "reports", "-q", cwd=tmp_path, env={"PYTHONPATH": str(EXAMPLE / "src")})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    start = run.stdout.index("attention-conformance: backend 'toy'")
    printed = run.stdout[start:].splitlines()[:len(shown)]

    def hashless(lines):
        return [re.sub(r"in spec [0-9a-f]{16}", "in spec HASH", line) for line in lines]
    assert hashless(shown) == hashless(printed), "\n".join(printed)


def test_the_fuzz_step_says_which_extra_it_needs():
    """`fuzz` needs Hypothesis, which only an extra installs: step 8 names it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    [extra] = [name for name, needs in extras.items() if name != "test"
               and any(n.startswith("hypothesis") for n in needs)]
    step = GUIDE.read_text().split("## 8. Fuzz it", 1)[1].split("\n## ", 1)[0]
    assert f"pip install 'attention-conformance[{extra}]'" in step


def _report(directory: Path) -> dict:
    return json.loads((directory / "toy.json").read_text())


def test_certify_the_package_by_path(tiny, package, tmp_path):
    """Step 3 of the guide: PYTHONPATH=src attention-conformance certify
    src/toy_attention/adapter.py:ToyBackend (here on the suite's small test spec)."""
    result = cli("--spec-dir", tiny, "certify", "src/toy_attention/adapter.py:ToyBackend",
                 "--report", tmp_path, "-q", cwd=package, env={"PYTHONPATH": "src"})
    assert result.returncode == 0, result.stdout + result.stderr
    data = _report(tmp_path)
    # float64 and float32 of softmax, sdpa (2 shapes), weights, the empty row: pass;
    # float16 and bfloat16, and self_attention (not defined): unsupported
    assert data["totals"] == {"pass": 10, "unsupported": 8}
    assert data["backend"]["policy"]["fully_masked_rows"] == "nan"
    assert data["versions"]["toy-attention"] == "0.1.0"
    md = (tmp_path / "toy.md").read_text()
    assert "backend has no method 'self_attention'" in md


def _throwaway_env(path: Path) -> Path:
    """A new virtual environment that also sees the packages of this one (the suite,
    NumPy, pytest, pip, setuptools), so that installing into it needs no network."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    parents = [p for p in site.getsitepackages() + [site.getusersitepackages()]
               if Path(p).is_dir()]
    Path(purelib, "_parent_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in parents))
    return python


def test_install_the_package_and_certify_it_by_entry_point(tiny, package, tmp_path):
    """Step 4: pip install the package; `attention-conformance certify toy` finds it by
    its entry point (group attention_conformance.backends)."""
    for needed in ("pip", "setuptools"):       # looked up, not imported (setuptools
        if importlib.util.find_spec(needed) is None:   # patches distutils on import)
            pytest.skip(f"{needed} is not installed: the example cannot be installed")
    python = _throwaway_env(tmp_path / "env")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "-q", "-e", str(package)],
        capture_output=True, text=True, timeout=180)
    assert install.returncode == 0, install.stdout + install.stderr

    result = cli("--spec-dir", tiny, "certify", "toy", "--report", tmp_path / "r", "-q",
                 python=python)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backend 'toy'" in result.stdout
    assert _report(tmp_path / "r")["totals"] == {"pass": 10, "unsupported": 8}

    elsewhere = cli("--spec-dir", tiny, "certify", "toy")      # not installed here
    assert elsewhere.returncode == 4 and "unknown backend 'toy'" in elsewhere.stderr

    fuzzed = cli("fuzz", "toy", "--examples", "25", "-q", python=python)      # step 7
    assert fuzzed.returncode == 0 and "no failure" in fuzzed.stdout, fuzzed.stdout
