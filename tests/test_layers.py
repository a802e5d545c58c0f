"""The package's structure: imports run one way, and the schema follows the tables.

The import graph counts every import of a package module, at module level or inside
a function, so that a function-level import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jsonschema

from attention_conformance.dtypes import DTYPES, UNIT_ROUNDOFF
from attention_conformance.ops import CAUSAL_ALIGNMENTS, OPS, SCORE_KINDS
from attention_conformance.policies import POLICIES
from attention_conformance.spec_folder import default_folder

PACKAGE = Path(__file__).resolve().parent.parent / "conformance"
SCHEMA = json.loads(default_folder().schema_file.read_text())

#: the layers, lowest first; a module may import only modules of its own layer or below
LAYERS = [
    ("tables", {"dtypes", "ops", "shapes", "policies", "outcomes", "indexing", "case",
                "spec_yaml", "timeout"}),
    ("where the spec lives", {"tolerances", "spec_folder"}),
    ("inputs, reference, golden", {"inputs", "reference", "golden_compute", "golden_store",
                                   "golden_freeze"}),
    ("calling a backend", {"calling", "interface", "loading", "backends", "wire", "worker",
                           "launch", "isolation"}),
    ("checks", {"context", "comparison", "statistics", "properties", "checks"}),
    ("loading and validation", {"validation", "spec_schema", "spec_cache", "spec_loader",
                                "expected"}),
    ("running a case", {"runner", "verdict", "judge_process", "judge"}),
    ("results and reports", {"results", "report", "report_html", "export", "api", "fuzz"}),
    ("plugin and command line", {"plugin", "pytest_cases", "cli", "__main__"}),
]


def _imports(path: Path) -> set[str]:
    """Package modules that a module imports, anywhere in its text."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attention_conformance"):
            rest = node.module.split(".")[1:2]
            found.update(rest or [alias.name for alias in node.names])
    return found


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    return {m: (_imports(PACKAGE / f"{m}.py") & modules) - {m} for m in modules}


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
    edges["ops"] = edges["ops"] | {"runner"}          # runner -> ... -> ops, planted back
    assert _cycle(edges) is not None


def test_every_module_has_a_layer_and_imports_only_downwards():
    layer_of = {m: i for i, (_, members) in enumerate(LAYERS) for m in members}
    edges = graph()
    assert set(edges) <= set(layer_of), f"modules without a layer: {set(edges) - set(layer_of)}"
    upward = [f"{m} ({LAYERS[layer_of[m]][0]}) imports {d} ({LAYERS[layer_of[d]][0]})"
              for m, deps in edges.items() for d in deps if layer_of[d] > layer_of[m]]
    assert not upward, "\n".join(upward)


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
             *PACKAGE.glob("*.py"), *(root / "backends").glob("*.py")]
    outside = [p.name for p in texts if "DESIGN.md" in p.read_text() or "../shared" in p.read_text()]
    assert not outside, f"these refer outside the repository: {outside}"
