"""The package's structure: its folders are its layers, imports run one way through them,
docs/contributing.md's layer table is the code's, and the schema follows the tables.

The import graph counts every import of a package module, at module level or inside
a function, so that a function-level import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import jsonschema

from attention_conformance.model.dtypes import DTYPES, UNIT_ROUNDOFF
from attention_conformance.model.folder import default_folder
from attention_conformance.model.ops import CAUSAL_ALIGNMENTS, OPS, SCORE_KINDS
from attention_conformance.model.policies import POLICIES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "conformance"
CONTRIBUTING = ROOT / "docs" / "contributing.md"
SCHEMA = json.loads(default_folder().schema_file.read_text())
#: the built-in adapters' package, mapped into the import root beside the suite's layers
#: (it imports nothing of the suite): the backend layer finds backends in it
ADAPTERS = ("backends", "backend")


def layer_table(text: str) -> list[tuple[str, str, list[str]]]:
    """(layer, folder, modules) of each row of the page's layer table, lowest first; the
    folder is '' for the package's top."""
    section = text[text.index("## The layers"):]
    section = section[:section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].startswith("`"):
            folder = re.fullmatch(r"`(\w+)/`", cells[1])
            rows.append((cells[0], folder[1] if folder else "", re.findall(r"`(\w+)`", cells[2])))
    return rows


LAYERS = layer_table(CONTRIBUTING.read_text())


def package_modules() -> dict[str, str]:
    """Dotted module name (under the import root) -> its folder ('' for the top)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] != "__init__":
            found[".".join(parts)] = parts[0] if len(parts) > 1 else ""
    return found


def _imports(module: str, path: Path) -> set[str]:
    """Dotted names (under the import root) that a module imports, anywhere in its text:
    each imported module, or the package of each imported name."""
    package = module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attention_conformance"):
            base = node.module.split(".")[1:]
        else:
            continue
        found.add(".".join(base))
        found.update(".".join(base + [alias.name]) for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = package_modules()
    known = set(modules) | {ADAPTERS[0]}
    return {m: {d for d in _imports(m, PACKAGE.joinpath(*m.split(".")).with_suffix(".py"))
                if d in known and d != m} for m in modules}


def layer_of() -> dict[str, int]:
    """Module -> the index of its layer in the page's table (its folder's row)."""
    rank = {folder: i for i, (_, folder, _) in enumerate(LAYERS)}
    return {**{m: rank.get(folder, -1) for m, folder in package_modules().items()},
            ADAPTERS[0]: rank[ADAPTERS[1]]}


def upward_imports(edges: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    return [f"{m} imports {d}, a later layer ({LAYERS[layers[d]][0]})"
            for m, deps in sorted(edges.items()) for d in sorted(deps)
            if layers[d] > layers[m] and LAYERS[layers[m]][1]]


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    cycle = _cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = graph()
    edges["model.ops"] = edges["model.ops"] | {"checking.verdict"}     # planted back
    assert _cycle(edges) is not None


def test_the_page_lists_every_module_in_its_folder_and_no_other():
    listed = {(folder + "." if folder else "") + m for _, folder, modules in LAYERS for m in modules}
    assert listed == set(package_modules()), (
        f"in the code, not on the page: {sorted(set(package_modules()) - listed)}; "
        f"on the page, not in the code: {sorted(listed - set(package_modules()))}")


def test_every_folder_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {folder for _, folder, _ in LAYERS if folder}


def test_imports_only_go_down_the_layers():
    assert not upward_imports(graph(), layer_of()), "\n".join(upward_imports(graph(), layer_of()))


def test_a_planted_upward_import_is_found():
    edges = graph()
    edges["model.ops"] = edges["model.ops"] | {"reports.results"}
    assert upward_imports(edges, layer_of()) == [
        "model.ops imports reports.results, a later layer (reports)"]


def test_a_page_that_disagrees_is_found():
    text = CONTRIBUTING.read_text().replace("`shapes`, ", "", 1)
    listed = {(f + "." if f else "") + m for _, f, ms in layer_table(text) for m in ms}
    assert set(package_modules()) - listed == {"model.shapes"}


def _enum(*path):
    node = SCHEMA
    for key in path:
        node = node[key]
    return node["enum"]


def test_the_schema_is_a_valid_json_schema():
    jsonschema.validators.validator_for(SCHEMA).check_schema(SCHEMA)


def test_the_schema_enums_equal_the_tables():
    case = SCHEMA["$defs"]["case"]["properties"]
    assert set(case["op"]["enum"]) == set(OPS)
    assert set(_enum("$defs", "dtype")) == set(DTYPES) == set(UNIT_ROUNDOFF)
    params = SCHEMA["$defs"]["params"]["properties"]
    assert set(params["causal"]["enum"]) - {None} == set(CAUSAL_ALIGNMENTS)
    assert set(params["kind"]["enum"]) == set(SCORE_KINDS)
    policy = SCHEMA["$defs"]["expect"]["properties"]["policy"]
    assert set(policy["propertyNames"]["enum"]) == set(POLICIES)
    choices = policy["additionalProperties"]["propertyNames"]["enum"]
    assert set(choices) == {c for cs in POLICIES.values() for c in cs}


def test_the_schema_params_are_the_ops_params():
    params = set(SCHEMA["$defs"]["params"]["properties"])
    assert params == {p for op in OPS.values() for p in op.params}


def test_the_docs_list_every_op():
    text = (PACKAGE.parent / "docs" / "interface.md").read_text()
    missing = [name for name in OPS if f"`{name}(" not in text]
    assert not missing, f"docs/interface.md does not document {missing}"


def test_the_docs_and_code_stand_alone():
    """No page or docstring sends a reader to a file outside the repository."""
    root = PACKAGE.parent
    texts = [root / "README.md", root / "spec" / "README.md", *root.glob("docs/*.md"),
             *PACKAGE.rglob("*.py"), *(root / "backends").glob("*.py")]
    outside = [p.name for p in texts if "DESIGN.md" in p.read_text() or "../shared" in p.read_text()]
    assert not outside, f"these refer outside the repository: {outside}"


#: the most lines a module of the package may have, and an adapter of backends/
#: (docs/contributing.md): a module longer than a screenful of screens is two modules
MODULE_LINES, ADAPTER_LINES = 600, 450


def test_no_module_and_no_adapter_outgrows_its_limit():
    too_long = [f"{p.relative_to(ROOT)}: {n} lines" for folder, limit in
                ((PACKAGE, MODULE_LINES), (ROOT / "backends", ADAPTER_LINES))
                for p in sorted(folder.rglob("*.py"))
                if (n := len(p.read_text().splitlines())) > limit]
    assert not too_long, too_long
