"""How quickly the explorer's page opens and responds in a browser, for large steps.

    python benchmarks/explorer.py [--rounds 3] [--screenshot docs/images/explorer.png]

Steps: the 1,000-parameter Adam step of benchmarks/adam.py (its "many" case: 1,000 tensors of
1k-10k elements), as optim.Adam writes it (one multi-tensor kernel when traced) and as plain
ops (`graphopt-ops`: some 12,000 nodes as traced, fused by the passes); and the train_mlp
step (examples/train_mlp.py). For each: the time to make the page (the passes again with a
snapshot after each, the drawings, the kernels), its size, and in headless chromium (Debian's,
through selenium) the time until the page is drawn (DOMContentLoaded: the HTML parsed, the
data's JSON read, the first view drawn), the page's load event, and the slowest response to
selecting a pass, to a search and to selecting a kernel. The rounds interleave the steps;
each figure is the median over the rounds. No figure is asserted anywhere.

`--screenshot PATH` also saves the train_mlp page, a kernel selected in its drawing, as the
docs show it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]

import adam  # noqa: E402  (benchmarks/adam.py: the 1,000-tensor case)
from support import chromium_missing, headless_chromium, open_page  # noqa: E402

import graphopt as go  # noqa: E402

# What the page is asked to do once it is open, timed inside it (milliseconds).
RESPONSES = """
const t = [performance.now()];
for (let i = 0; i < DATA.passes.length; i++) selectPass(i);
t.push(performance.now());
search("multiply");
t.push(performance.now());
if (DATA.kernels.length) selectKernel(DATA.kernels[0].id);
t.push(performance.now());
const nav = performance.getEntriesByType("navigation")[0];
return {load_ms: nav.loadEventEnd, drawn_ms: nav.domContentLoadedEventEnd,
        pass_ms: (t[1] - t[0]) / Math.max(DATA.passes.length, 1), search_ms: t[2] - t[1],
        kernel_ms: t[3] - t[2]};
"""


def adam_step(variant: str):
    ps, gs = adam.make_data(adam.case_shapes("many"))
    fn, _ = adam.graphopt_adam_step(ps, {}, variant)
    args = (gs,) if variant == "graphopt" else (gs, 0.001, 1.0)
    return go.jit(fn).lower(*args)


def mlp_step():
    import train_mlp
    step, _, x, labels = train_mlp.make_step()
    return go.jit(step).lower(x, labels)


STEPS = {"adam 1000 (optim.Adam)": lambda: adam_step("graphopt"),
         "adam 1000 (ops)": lambda: adam_step("graphopt-ops"),
         "train_mlp": mlp_step}


def screenshot(exe, path: Path, folder: Path) -> None:
    """The train_mlp page with its fused graph drawn and a kernel's details beside it."""
    page = folder / "screenshot.html"
    exe.explore(page)
    driver = headless_chromium(1500, 900)
    try:
        open_page(driver, page)
        driver.execute_script("""
            const k = DATA.kernels.find(k => k.refusals.length) || DATA.kernels[0];
            selectKernel(k.id); openTab("graph");
            document.getElementById("drawing").classList.add("actual");
            highlightEdges(k.id);
            const g = [...document.querySelectorAll("#drawing g.node")].find(
                g => g.querySelector("title").textContent === k.id);
            if (g) g.scrollIntoView({block: "center", inline: "center"});""")
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
    finally:
        driver.quit()
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--screenshot", type=Path, help="save the train_mlp page's picture here")
    args = parser.parse_args()
    missing = chromium_missing()
    if missing:
        raise SystemExit(f"cannot open the page: {missing}")
    folder = Path(tempfile.mkdtemp(prefix="explorer-bench-"))
    exes = {name: make() for name, make in STEPS.items()}
    figures: dict[str, list[dict]] = {name: [] for name in STEPS}
    driver = headless_chromium()
    try:
        for _ in range(args.rounds):
            for k, (name, exe) in enumerate(exes.items()):  # interleaved: noise hits all alike
                page = folder / f"step{k}.html"
                start = time.perf_counter()
                exe.explore(page)
                made = (time.perf_counter() - start) * 1e3
                open_page(driver, page)
                row = driver.execute_script(RESPONSES)
                row.update(make_ms=made, mb=page.stat().st_size / 1e6,
                           nodes=len(exe.traced_graph.nodes))
                figures[name].append(row)
    finally:
        driver.quit()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"explorer page, median of {args.rounds} rounds (load average {' '.join(load)})")
    print(f"{'step':<24} {'nodes':>6} {'MB':>6} {'make s':>7} {'drawn ms':>9} {'load ms':>8} "
          f"{'pass ms':>8} {'search ms':>10} {'kernel ms':>10}")
    for name, rows in figures.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{name:<24} {med['nodes']:>6.0f} {med['mb']:>6.1f} {med['make_ms'] / 1e3:>7.2f} "
              f"{med['drawn_ms']:>9.0f} {med['load_ms']:>8.0f} {med['pass_ms']:>8.1f} "
              f"{med['search_ms']:>10.1f} {med['kernel_ms']:>10.1f}")
    if args.screenshot:
        screenshot(exes["train_mlp"], args.screenshot, folder)


if __name__ == "__main__":
    main()
