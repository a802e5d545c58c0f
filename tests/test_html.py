"""The static HTML page of the matrix: well-formed, and rendered by a real headless browser."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from attention_conformance.report import matrix_html
from attention_conformance.results import ResultLog

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _Spec:
    cases = [object()] * 3
    errors = []


def _report(name, statuses, policy="zeros"):
    """A backend report made by the suite's own ResultLog from a list of statuses."""
    info = {"name": name, "dtypes": ["float32"], "versions": {"fw": "1.0"}, "paths": {},
            "policy": {"fully_masked_rows": policy, "neg_inf_bias_rows": "nan",
                       "masked_key_nan": "ignored", "masked_value_nan": "propagates"}}
    log = ResultLog(info, _Spec(), selection={"profile": "quick"})
    for i, (topic, dtype, status) in enumerate(statuses):
        log.add({"id": f"{topic}/case-{i}[{dtype}]", "topic": topic, "case": f"case-{i}",
                 "variant": "", "dtype": dtype, "status": status, "message": "m",
                 "seconds": 0.0, "error_over_tolerance": 0.5 if status == "pass" else 0.0})
    log.finish()
    return log.as_dict()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    good = _report("numpy", [("masks", "float32", "pass"), ("causal", "float32", "pass"),
                             ("causal", "float16", "pass")])
    bad = _report("<b>bad</b>", [("masks", "float32", "fail"), ("causal", "float32", "pass"),
                                 ("causal", "float16", "unsupported")], policy="uniform")
    path = tmp_path_factory.mktemp("html") / "matrix.html"
    path.write_text(matrix_html([bad, good]))
    return path


class _Tables(HTMLParser):
    """Cell texts of every table, by table id; fails on a closing tag that does not match."""

    VOID = {"meta", "br", "img", "link", "hr", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.tables, self.cell = [], {}, None

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "table":
            self.current = self.tables.setdefault(dict(attrs)["id"], [])
        elif tag == "tr":
            self.current.append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"
        if tag in ("td", "th"):
            self.current[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_the_page_is_well_formed_and_static(page):
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "http" not in text
    parser = _Tables()
    parser.feed(text)
    assert not parser.stack
    tables = parser.tables
    assert set(tables) == {"totals", "topics", "dtypes", "errors", "policies", "tests",
                           "versions"}
    assert tables["topics"][0] == ["topic", "<b>bad</b>", "numpy"]     # escaped, as text
    assert tables["topics"][2] == ["masks", "0/1", "1/1"]
    assert ["fully_masked_rows", "uniform", "zeros"] in tables["policies"]
    assert ["masks/case-0[float32]", "fail", "pass"] in tables["tests"]


def _browser():
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


PROBE = """
<script>
const out = {title: document.title, tables: {}};
for (const table of document.querySelectorAll("table")) {
  const box = table.getBoundingClientRect();
  out.tables[table.id] = {
    width: box.width, height: box.height,
    rows: [...table.rows].map(r => [...r.cells].map(c => c.innerText.trim())),
    colors: [...table.querySelectorAll("td")].map(c => [c.innerText.trim(), getComputedStyle(c).backgroundColor]),
  };
}
const pre = document.createElement("pre");
pre.id = "probe";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>
"""


def test_a_headless_browser_renders_the_matrix(page, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser: install Debian's chromium "
                    "(apt-get install -y --no-install-recommends chromium) to run this test")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900",
         "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=90)
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, f"the browser rendered no probe (exit {result.returncode}): {result.stderr[-2000:]}"
    seen = json.loads(html.unescape(found.group(1)))
    assert seen["title"] == "Attention conformance matrix"
    tables = seen["tables"]
    assert set(tables) >= {"totals", "topics", "dtypes", "policies", "tests"}
    for table_id, table in tables.items():
        assert table["width"] > 50 and table["height"] > 20, f"table {table_id} is not laid out"
        assert table["width"] <= 1200, f"table {table_id} is wider than the window"
    assert tables["topics"]["rows"][0] == ["topic", "<b>bad</b>", "numpy"]
    assert ["masks", "0/1", "1/1"] in tables["topics"]["rows"]
    assert ["causal", "1/1, 1 unsupported", "2/2"] in tables["topics"]["rows"]
    colors = dict(tables["topics"]["colors"])
    assert colors["0/1"] == "rgb(246, 208, 208)"      # red: failed
    assert colors["1/1"] == "rgb(216, 240, 216)"      # green: all passed
    assert colors["1/1, 1 unsupported"] == "rgb(216, 240, 216)"
