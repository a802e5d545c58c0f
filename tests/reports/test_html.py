"""The static HTML page of the matrix: well-formed, self-contained, escaped, and rendered
by a real headless browser (colours, grouping by case, the filter)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import urllib.parse
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from attention_conformance.reports.markdown import failure_groups, matrix_markdown
from attention_conformance.reports.html import matrix_html
from attention_conformance.reports.html import TONES
from attention_conformance.reports.results import ResultLog

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: a reason that would run a script if the page did not escape it
EVIL = '<img src=x onerror="document.title=\'pwned\'"> & "quotes"'


class _Spec:
    cases = [SimpleNamespace(id=f"case-{i}", profile="quick", variants=(None,), dtypes=("float32",))
             for i in range(3)]
    errors = []


def _report(name, statuses, policy="zeros"):
    """A backend report made by the suite's own ResultLog from (topic, case, dtype,
    status[, message]) tuples."""
    info = {"name": name, "dtypes": ["float32"], "versions": {"fw": "1.0"}, "paths": {},
            "policy": {"fully_masked_rows": policy, "neg_inf_bias_rows": "nan",
                       "masked_key_nan": "ignored", "masked_value_nan": "propagates"}}
    log = ResultLog(info, _Spec(), selection={"profile": "quick"})
    for topic, case, dtype, status, *message in statuses:
        log.add({"id": f"{topic}/{case}[{dtype}]", "topic": topic, "case": case,
                 "variant": "", "dtype": dtype, "status": status,
                 "message": message[0] if message else "m", "seconds": 0.0,
                 "error_over_tolerance": 0.5 if status == "pass" else 0.0})
    log.finish()
    return log.as_dict()


BAD = "<b>bad</b>"


def _reports():
    """numpy passes; BAD fails one case in three dtypes (and one elsewhere); 'found' has
    expected failures only; 'nothing' ran nothing (every test unsupported)."""
    good = _report("numpy", [("masks", "m-1", "float32", "pass"),
                             ("causal", "c-1", "float32", "pass"),
                             ("causal", "c-1", "float16", "pass")])
    reason = "golden out: worst abs error 2 at [0]\nsecond line, not shown"
    bad = _report(BAD, [("masks", "m-1", d, "fail", reason)
                        for d in ("float32", "float16", "bfloat16")]
                  + [("masks", "m-1", "float64", "pass"),
                     ("causal", "c-1", "float32", "fail", EVIL),
                     ("causal", "c-1", "float16", "unsupported", "no float16")],
                  policy="uniform")
    found = _report("found", [("masks", "m-1", "float32", "xfail", "a finding\nmore"),
                              ("causal", "c-1", "float32", "pass")])
    nothing = _report("nothing", [("masks", "m-1", "float32", "unsupported", "no"),
                                  ("causal", "c-1", "float32", "unsupported", "no")])
    return [bad, good, found, nothing]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = tmp_path_factory.mktemp("html") / "matrix.html"
    path.write_text(matrix_html(_reports()))
    return path


class _Tables(HTMLParser):
    """Cell texts and classes of every table, by table id; every tag and attribute seen;
    fails on a closing tag that does not match."""

    VOID = {"meta", "br", "img", "link", "hr", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.tables, self.cell, self.tags, self.rows = [], {}, None, [], {}

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "table":
            self.current = self.tables.setdefault(dict(attrs)["id"], [])
            self.rows[dict(attrs)["id"]] = []
        elif tag == "tr":
            self.current.append([])
            self.rows[list(self.rows)[-1]].append(dict(attrs))
        elif tag in ("td", "th"):
            self.cell, self.css = "", dict(attrs).get("class", "")

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"
        if tag in ("td", "th"):
            self.current[-1].append((self.cell, self.css))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _parsed(page):
    parser = _Tables()
    parser.feed(page.read_text())
    assert not parser.stack
    return parser


def test_the_page_is_well_formed_self_contained_and_escaped(page):
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    parsed = _parsed(page)
    assert not [t for t, a in parsed.tags if t in ("img", "link", "iframe", "object")]
    assert not [a for _, a in parsed.tags if "src" in a or "href" in a]
    assert "http" not in text and "@import" not in text and "url(" not in text
    assert set(parsed.tables) == {"totals", "topics", "dtypes", "errors", "policies",
                                  "failures", "versions"}
    texts = {k: [[c for c, _ in row] for row in rows] for k, rows in parsed.tables.items()}
    assert texts["topics"][0] == ["topic", BAD, "numpy", "found", "nothing"]   # as text
    assert ["fully_masked_rows", "uniform", "zeros", "zeros", "zeros"] in texts["policies"]
    assert EVIL in [c for row in texts["failures"] for c in row]              # as text
    assert html.escape(EVIL) in text and EVIL not in text


def test_cells_follow_the_colour_rule(page):
    tables = _parsed(page).tables
    topics = {row[0][0]: row[1:] for row in tables["topics"][1:]}
    #            BAD                              numpy           found                  nothing
    assert topics["masks"] == [("1/4", "bad"), ("1/1", "ok"), ("1/1 (1 xfail)", "warn"),
                               ("nothing ran (1 unsupported)", "none")]
    assert topics["causal"][0] == ("0/1, 1 unsupported", "bad")
    overall = {row[0][0]: row[1] for row in tables["totals"][1:]}
    assert overall["nothing"] == ("nothing ran (2 unsupported)", "none")
    assert overall[BAD][1] == "bad" and overall["numpy"][1] == "ok"
    markdown = matrix_markdown(_reports())
    assert "| masks | 1/4 | 1/1 | 1/1 (1 xfail) | nothing ran (1 unsupported) |" in markdown


def test_tests_that_do_not_pass_are_grouped_by_case_without_a_cut():
    groups = failure_groups(_reports())
    bad_masks = [g for g in groups if g["backend"] == BAD and g["case"] == "m-1"]
    assert len(bad_masks) == 1
    assert bad_masks[0]["count"] == 3 and bad_masks[0]["of"] == 4
    assert bad_masks[0]["reason"] == "golden out: worst abs error 2 at [0]"
    assert [g["status"] for g in groups] == ["fail", "fail", "xfail", "unsupported",
                                             "unsupported", "unsupported"]
    many = _report("many", [("t", f"case-{i}", "float32", "fail") for i in range(700)])
    assert len(failure_groups([many])) == 700
    assert matrix_html([many]).count('data-status="fail"') == 700


def _browser():
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


#: run after the page's own script; optionally applies a filter through the selects
PROBE = """
<script>
const select = %s;
for (const [name, value] of Object.entries(select)) {
  const box = document.getElementById("filter-" + name);
  box.value = value;
  box.dispatchEvent(new Event("change"));
}
const out = {title: document.title, hash: location.hash, tables: {},
             images: document.querySelectorAll("img").length,
             shown: document.getElementById("shown").textContent};
for (const table of document.querySelectorAll("table")) {
  const box = table.getBoundingClientRect();
  out.tables[table.id] = {
    width: box.width, height: box.height,
    rows: [...table.rows].map(r => [...r.cells].map(c => c.innerText.trim())),
    visible: [...table.tBodies[0].rows].filter(r => r.getClientRects().length > 0)
             .map(r => ({backend: r.dataset.backend, status: r.dataset.status,
                         cells: [...r.cells].map(c => c.innerText.trim())})),
    colors: [...table.querySelectorAll("td")].map(c => [c.innerText.trim(),
             getComputedStyle(c).backgroundColor]),
  };
}
const pre = document.createElement("pre");
pre.id = "probe";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>
"""


def _render(page, tmp_path, fragment="", select=None):
    """What a headless browser shows of the page (opened at #fragment, after choosing
    the filter values select in the page's own drop-downs)."""
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser: install Debian's chromium "
                    "(apt-get install -y --no-install-recommends chromium) to run this test")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>",
                                               PROBE % json.dumps(select or {}) + "</body>"))
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=1200,900", "--dump-dom", probed.as_uri() + fragment],
        capture_output=True, text=True, timeout=90)
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, f"the browser rendered no probe (exit {result.returncode}): {result.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def _rgb(hex_colour):
    return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))


def test_a_headless_browser_renders_the_colours_and_the_grouping(page, tmp_path):
    seen = _render(page, tmp_path)
    assert seen["title"] == "Attention conformance matrix" and seen["images"] == 0
    tables = seen["tables"]
    for table_id, table in tables.items():
        assert table["width"] > 50 and table["height"] > 20, f"table {table_id} is not laid out"
        assert table["width"] <= 1200, f"table {table_id} is wider than the window"
    assert tables["topics"]["rows"][0] == ["topic", BAD, "numpy", "found", "nothing"]
    colours = dict(tables["topics"]["colors"])
    assert colours["nothing ran (1 unsupported)"] == _rgb(TONES["none"][0])    # grey
    assert colours["1/4"] == _rgb(TONES["bad"][0]) == "rgb(246, 208, 208)"    # red
    assert colours["1/1 (1 xfail)"] == _rgb(TONES["warn"][0])                 # amber
    assert colours["1/1"] == _rgb(TONES["ok"][0]) == "rgb(216, 240, 216)"     # green
    assert len({_rgb(c) for c, _ in TONES.values()}) == 4
    rows = tables["failures"]["visible"]
    assert len(rows) == 6 and seen["shown"] == "6 of 6 rows shown"
    grouped = [r for r in rows if r["backend"] == BAD and r["cells"][0].startswith("m-1")]
    assert len(grouped) == 1
    assert grouped[0]["cells"][1:] == ["fail", BAD, "masks", "3 of 4",
                                       "golden out: worst abs error 2 at [0]"]


def test_the_filter_from_the_url_hash_hides_rows(page, tmp_path):
    fragment = "#" + urllib.parse.urlencode({"backend": BAD, "status": "fail"})
    seen = _render(page, tmp_path, fragment)
    rows = seen["tables"]["failures"]["visible"]
    assert [(r["backend"], r["status"]) for r in rows] == [(BAD, "fail")] * 2
    assert seen["shown"] == "2 of 6 rows shown"
    assert len(seen["tables"]["failures"]["rows"]) == 7          # hidden, not removed


def test_the_filter_drop_downs_hide_rows_and_set_the_hash(page, tmp_path):
    seen = _render(page, tmp_path, select={"status": "unsupported", "topic": "masks"})
    rows = seen["tables"]["failures"]["visible"]
    assert [(r["backend"], r["status"]) for r in rows] == [("nothing", "unsupported")]
    assert seen["shown"] == "1 of 6 rows shown"
    assert urllib.parse.parse_qs(seen["hash"][1:]) == {"topic": ["masks"],
                                                       "status": ["unsupported"]}
