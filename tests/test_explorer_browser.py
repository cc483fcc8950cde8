"""The explorer's page in a real browser: Debian's chromium, headless, driven by selenium
(with chromium-driver). The pages are made for examples/train_mlp.py's step and for a .gir
file; the tests click as a reader would and check what the page shows against the compiled
step. Without chromium they skip, saying why (.ci/run installs it)."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from support import chromium_missing, headless_chromium, open_page

import graphopt as go
from graphopt.cli import main
from graphopt.ir.kernel import cost, written

ROOT = Path(__file__).resolve().parents[1]
MISSING = chromium_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"no browser: {MISSING}")

MERGE = """graph merge {
  arg %x: f32[8]
  %0 = exp %x : f32[8]  loc("model.py":3)
  %1 = exp %x : f32[8]  loc("model.py":4)
  %2 = add %0, %1 : f32[8]  loc("model.py":5)
  return %2
}"""


@pytest.fixture(scope="module")
def driver():
    d = headless_chromium()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """(the compiled train_mlp step, the path of its page)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_mlp
    finally:
        sys.path.remove(str(ROOT / "examples"))
    step, _, x, labels = train_mlp.make_step()
    exe = go.jit(step).lower(x, labels)
    path = tmp_path_factory.mktemp("mlp") / "train_mlp.html"
    exe.explore(path)
    return exe, path


@pytest.fixture(scope="module")
def gir_page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gir")
    (folder / "merge.gir").write_text(MERGE)
    path = folder / "merge.html"
    assert main(["explore", str(folder / "merge.gir"), "--passes", "cse,fuse,dce",
                 "-o", str(path)]) == 0
    return path


def _text(driver, css: str) -> str:
    return driver.find_element("css selector", css).text


def _defined(lines: list[str]) -> set[str]:
    """The values that lines of a diff define (`-  %1 = exp %x`: %1)."""
    return {m.group(1) for t in lines if (m := re.match(r"[-+]\s+(%\w+) = ", t))}


def _no_errors(driver) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_the_page_opens_from_disk_and_requests_nothing(driver, mlp, tmp_path):
    open_page(driver, mlp[1])
    # Resource entries are what the page loaded besides itself: none.
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert driver.title.startswith("graphopt explorer: ")
    shot = tmp_path / "train_mlp.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _no_errors(driver)


def test_unchanged_passes_are_greyed(driver, mlp):
    exe, path = mlp
    open_page(driver, path)
    rows = driver.find_elements("css selector", "#timeline tr[data-pass]")[1:]  # (as traced)
    assert [r.find_element("css selector", "td").text for r in rows] == \
        [s.name for s in exe.pass_result.stats]
    assert ["unchanged" in r.get_attribute("class") for r in rows] == \
        [not s.changed for s in exe.pass_result.stats]


def test_selecting_a_pass_shows_its_diff_naming_the_node_that_went_away(driver, gir_page):
    open_page(driver, gir_page)
    driver.find_element("css selector", '#timeline tr[data-pass="0"]').click()  # cse
    assert driver.find_element("css selector", "#diff").is_displayed()
    removed = [e.text for e in driver.find_elements("css selector", "#diff .del")]
    added = [e.text for e in driver.find_elements("css selector", "#diff .add")]
    gone = _defined(removed) - _defined(added)
    assert any("%1 = exp %x" in t for t in removed)
    assert gone == {"%1"}
    # The IR after it keeps the diff's names: the add reads the exp that stayed.
    driver.find_element("css selector", '#tabs button[data-tab="ir"]').click()
    assert "%2 = add %0, %0" in _text(driver, "#ir pre")
    _no_errors(driver)


def test_a_node_in_the_drawing_shows_its_details_and_edges(driver, gir_page):
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed: the page shows no drawing")
    open_page(driver, gir_page)
    driver.find_element("css selector", '#timeline tr[data-pass="-1"]').click()
    driver.find_element("css selector", '#tabs button[data-tab="graph"]').click()
    node = next(g for g in driver.find_elements("css selector", "#drawing g.node")
                if g.find_element("css selector", "title").get_attribute("textContent") == "n2")
    node.click()
    assert "%2 = add" in _text(driver, "#details h3")
    # Coloured by category, as the legend and the details' badge say.
    color = driver.execute_script("return nodesOf(state.snapshot).byId.get('n2').color")
    assert node.find_element("css selector", "path, polygon").get_attribute("fill") == color
    assert "elementwise" in _text(driver, "#legend")
    assert "model.py:5" in _text(driver, "#details .source")
    reads = _text(driver, "#details dl")
    assert "%0 = exp" in reads and "%1 = exp" in reads
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseover', "
                          "{bubbles: true}))", node)
    lit = driver.find_elements("css selector", "#drawing g.edge.hl")
    assert len(lit) == 3  # from %0 and %1, to the return


def test_a_kernel_shows_its_bytes_refusals_and_llvm(driver, mlp):
    exe, path = mlp
    open_page(driver, path)
    index = {id(n): k for k, n in enumerate(exe.graph.nodes)}
    refused = driver.execute_script(
        "return DATA.kernels.filter(k => k.refusals.length).map(k => k.id)")
    assert refused, "train_mlp's step has refused merges (the matmuls between its kernels)"
    passes = driver.execute_script("return DATA.passes")
    printed = "\n".join(driver.execute_script("return DATA.snapshots.map(s => s.ir)"))
    for compiled in exe.kernels:
        kid = f"n{index[id(compiled.node)]}"
        driver.find_element("css selector", f'#kernel-list li[data-kernel="{kid}"]').click()
        c = cost(compiled.node)
        assert f"{c.bytes_per_element} (read {c.read_per_element}, write " \
               f"{c.write_per_element})" in _text(driver, "#kernel-cost")
        llvm = driver.find_element("css selector", "#kernel pre.llvm").text
        assert f"@{compiled.name}(" in llvm and "define" in llvm
        assert ("hit" if compiled.cache_hit else "miss") in _text(driver, "#kernel dl:last-of-type")
        shown = [e.text for e in driver.find_elements("css selector", "#kernel .refusal")]
        assert (kid in refused) == bool(shown)
        for text in shown:
            # the reason as the pass gave it, naming nodes as the page's IR printed them
            assert text.split(": ")[-1] in {r["reason"].split(": ")[-1] for p in passes
                                            for r in p["refusals"]}
            for named in re.findall(r"%\w+ = \w+", text):
                assert named in printed, (named, text)
    _no_errors(driver)


def test_search_finds_nodes_by_op_and_by_line(driver, mlp):
    exe, path = mlp
    open_page(driver, path)
    box = driver.find_element("css selector", "#search")
    box.send_keys("matmul")
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, 10).until(lambda d: d.find_elements("css selector", "#result-list"))
    hits = driver.find_elements("css selector", "#result-list li")
    assert len(hits) == sum(n.op == "matmul" for n in exe.graph.nodes) > 0
    hits[0].find_element("css selector", "a").click()
    assert "= matmul" in _text(driver, "#details h3")
    assert "train_mlp.py:" in _text(driver, "#details .source")


def test_a_parameter_path_in_one_click(driver, mlp):
    exe, path = mlp
    open_page(driver, path)
    param = exe.graph.param("fc0.w")
    index = {id(n): k for k, n in enumerate(exe.graph.nodes)}
    writers = [f"n{index[id(n)]}" for n in exe.graph.nodes if param in written(n)]
    readers = [f"n{index[id(n)]}" for n in exe.graph.nodes if param in n.inputs]
    driver.execute_script("selectNode(arguments[0])",
                          f"in{exe.graph.inputs.index(param)}")
    driver.find_element("css selector", "#show-path").click()
    links = driver.find_elements("css selector", "#path a.node")
    assert sorted(a.get_attribute("data-id") for a in links) == sorted(set(readers + writers))
    assert writers and all(f'data-id="{w}"' in driver.find_element(
        "css selector", "#path").get_attribute("innerHTML") for w in writers)


def test_the_memory_plot_marks_what_the_backward_keeps(driver, mlp):
    exe, path = mlp
    open_page(driver, path)
    driver.find_element("css selector", '#tabs button[data-tab="memory"]').click()
    report = exe.memory_report()
    assert len(driver.find_elements("css selector", "#memory-plot line.kept")) == \
        len(report.kept) > 0
    assert driver.find_elements("css selector", "#memory-plot polygon")


def test_without_a_drawing_the_page_says_why(driver, tmp_path):
    graph = go.parse(MERGE)
    go.explorer.write_page(go.explorer.gather(graph, "cse", draw=False), tmp_path / "p.html")
    open_page(driver, tmp_path / "p.html")
    driver.find_element("css selector", '#tabs button[data-tab="graph"]').click()
    assert "not drawn" in _text(driver, "#no-drawing")
    assert "%0 = exp" in driver.find_element("css selector", "#ir pre").get_attribute(
        "textContent")
