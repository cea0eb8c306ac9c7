"""Every lesson in a real JupyterLab, in headless Chromium, as a learner runs it.

For each lesson: it opens unmodified (no kernelspec rewrite) with its saved explorers shown as
pictures, not text reprs; Run All finishes without an error or a stderr output; every ipywidgets
explorer renders as controls with uncut labels; changing a control changes the figure's pixels; its
exercise link opens the exercise notebook; the browser console stays clean and nothing is fetched
from the internet. One exercise notebook shows ``check()``'s ✗ then ✓ feedback. Screenshots of every
explorer land in the artifacts folder, and each lesson's line (Run All's time, the time to the first rendered
figure, what each explorer's control changed) in ``<lesson>-run-all.txt`` there; ``-n 0 -s`` also prints it.
``make test-browser`` runs two lessons at a time (pytest-xdist; one JupyterLab and one Chromium per worker),
so on two cores each Run All's time includes the other lesson's load.
"""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from .lab import BADGE, BADGE_SVG, REPO, Lab, copy_course, make_lab_flags

LESSONS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RUN_TIMEOUT = 300.0                     # s per lesson; the slowest runs ~50 s alone in nbconvert

APP = "window.jupyterapp"
PANEL = f"(() => {{ const a = {APP}; const w = a && a.shell.currentWidget; return w && w.context ? w : null }})()"


class LabPage:
    """One browser page on one notebook, with the checks the tests share."""

    def __init__(self, browser, lab, path: str):
        self.lab, self.path = lab, path
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.console: list[str] = []
        self.external: list[str] = []
        self.page.on("console", lambda m: self.console.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.console.append(f"uncaught: {e}"))
        self.page.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        if url.startswith(f"http://127.0.0.1:{self.lab.port}/") or url.startswith(("data:", "blob:")):
            route.continue_()
        elif url == BADGE:
            route.fulfill(status=200, content_type="image/svg+xml", body=BADGE_SVG)
        else:                                             # a lesson must not need the internet
            self.external.append(url)
            route.abort()

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def open(self):
        self.page.goto(self.lab.url(self.path))
        self.page.wait_for_function(
            f"() => {{ const w = {PANEL}; return w && w.context.path === {json.dumps(self.path)} && "
            "w.context.isReady && w.sessionContext.session && w.sessionContext.session.kernel && "
            "w.sessionContext.session.kernel.status === 'idle' }", timeout=90_000, polling=250)
        self.page.wait_for_timeout(1000)                  # let late metadata updates land
        return self

    def cells(self):
        """The cells of this page's notebook panel (not of another tab)."""
        panel = self.js(f"() => {PANEL}.node.id")
        return self.page.locator(f"#{panel} .jp-Notebook-cell")

    def dirty(self) -> bool:
        return self.js(f"() => {PANEL}.context.model.dirty")

    def output_texts(self) -> list[str]:
        return self.js("() => Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText)")

    def run_all(self, timeout: float = RUN_TIMEOUT) -> tuple[float, float | None]:
        """Run All; returns (seconds to finish, seconds to the first figure rendered in an output)."""
        self.js("""() => { window.__firstFigure = null; const t0 = performance.now(); window.__t0 = t0;
            const obs = new MutationObserver(() => {
              if (window.__firstFigure === null && document.querySelector('.jp-OutputArea-output img.__fresh, .jp-OutputArea-output img:not(.__seen)')) {
                window.__firstFigure = (performance.now() - t0) / 1000; obs.disconnect(); } });
            document.querySelectorAll('.jp-OutputArea-output img').forEach(i => i.classList.add('__seen'));
            obs.observe(document.querySelector('.jp-Notebook'), {childList: true, subtree: true}); }""")
        t0 = time.monotonic()
        self.js(f"() => {APP}.commands.execute('notebook:run-all-cells')")
        self.wait_idle(timeout)
        return time.monotonic() - t0, self.js("() => window.__firstFigure")

    def wait_idle(self, timeout: float):
        """Until no cell is queued or running and the kernel is idle (seen twice, a second apart)."""
        self.page.wait_for_timeout(1000)
        self.page.wait_for_function(
            f"""() => {{ const w = {PANEL};
              const busy = w.sessionContext.session.kernel.status !== 'idle' ||
                w.content.widgets.some(c => c.model.type === 'code' && c.promptNode && c.promptNode.textContent.includes('*'));
              if (busy) {{ window.__idleSince = null; return false; }}
              if (!window.__idleSince) window.__idleSince = performance.now();
              return performance.now() - window.__idleSince > 1000; }}""",
            timeout=timeout * 1000, polling=500)

    def problems(self) -> list[str]:
        """Error outputs and stderr streams, as ``cell N: ...`` lines (from the notebook model)."""
        return self.js(f"""() => {{ const w = {PANEL}; const r = [];
            w.content.widgets.forEach((c, i) => {{ if (c.model.type !== 'code') return;
              const o = c.model.outputs;
              for (let j = 0; j < o.length; j++) {{ const m = o.get(j).toJSON();
                if (m.output_type === 'error') r.push(`cell ${{i}}: ${{m.ename}}: ${{m.evalue}}`);
                if (m.output_type === 'stream' && m.name === 'stderr') r.push(`cell ${{i}} stderr: ${{[].concat(m.text).join('').slice(0, 300)}}`); }}
            }}); return r; }}""")

    def explorers(self) -> int:
        """Mark every top-level widget box holding an ``Output`` (an explorer); return how many."""
        return self.js("""() => { let k = 0;
            document.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').forEach(e => {
              if (e.parentElement.closest('.jupyter-widgets') || !e.querySelector('.widget-output')) return;
              e.setAttribute('data-explorer', k++); }); return k; }""")

    def shutdown(self):
        try:
            self.js(f"async () => {{ const w = {PANEL}; if (w) await w.sessionContext.shutdown(); }}")
        finally:
            self.page.close()


def figure_png(explorer, tries: int = 20) -> bytes:
    """A screenshot of the explorer's figure (retried while a redraw replaces the <img> under us)."""
    from playwright.sync_api import Error

    for attempt in range(tries):
        img = explorer.locator(".widget-output img").last
        try:
            img.wait_for(state="visible", timeout=30_000)
            return img.screenshot(timeout=10_000)
        except Error:
            if attempt == tries - 1:
                raise
            explorer.page.wait_for_timeout(500)


def pixels_differ(a: bytes, b: bytes) -> float:
    """Fraction of pixels that differ between two PNG screenshots (1.0 when the sizes differ)."""
    import matplotlib.image as mpimg
    import numpy as np

    x, y = mpimg.imread(io.BytesIO(a), format="png"), mpimg.imread(io.BytesIO(b), format="png")
    if x.shape != y.shape:
        return 1.0
    return float(np.mean(np.any(np.abs(x - y) > 1e-3, axis=-1)))


def change_controls(page: LabPage, explorer, before: bytes, timeout: float = 30.0):
    """Change the explorer's controls one at a time (sliders by keyboard, dropdowns, text boxes, then
    checkboxes) until the figure's pixels change. Returns (control description, changed fraction) or None."""
    attempts = []
    for i in range(explorer.locator(".widget-slider .noUi-handle").count()):
        h = explorer.locator(".widget-slider .noUi-handle").nth(i)
        if h.evaluate("h => !!h.closest('[disabled]')"):  # greyed out (lesson 10's m until Performer is picked)
            continue                                      # pressing keys on it would only wait out the timeout
        attempts.append((f"slider {i}", lambda h=h: (h.focus(), [h.press("ArrowRight") for _ in range(3)])))
    for i in range(explorer.locator(".widget-dropdown select").count()):
        sel = explorer.locator(".widget-dropdown select").nth(i)
        options = sel.locator("option").count()
        current = sel.evaluate("s => s.selectedIndex")
        if options > 1:
            attempts.append((f"dropdown {i}", lambda sel=sel, o=(current + 1) % options: sel.select_option(index=o)))
    for i in range(explorer.locator(".widget-text input").count()):
        box = explorer.locator(".widget-text input").nth(i)
        words = box.input_value().split()
        if len(words) > 1:                                # e.g. "3 1 4" -> "4 3 1"
            attempts.append((f"text {i}", lambda box=box, v=" ".join(words[-1:] + words[:-1]): (box.fill(v), box.press("Enter"))))
    for i in range(explorer.locator(".widget-checkbox input").count()):
        attempts.append((f"checkbox {i}", lambda c=explorer.locator(".widget-checkbox input").nth(i): c.click()))
    for name, act in attempts:
        act()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            page.page.wait_for_timeout(500)
            changed = pixels_differ(before, figure_png(explorer))
            if changed > 0.001:
                return name, changed
        page.wait_idle(timeout)
    return None


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_in_jupyterlab(lesson, lab, browser, artifacts, capsys):
    stem = Path(lesson).stem
    page = LabPage(browser, lab, f"notebooks/{lesson}").open()
    try:
        assert not page.dirty(), "JupyterLab modified the notebook on opening (kernelspec/metadata rewrite)"
        reprs = [t for t in page.output_texts() if "children=(" in t]
        assert not reprs, f"saved outputs show widget text reprs: {reprs[:2]}"
        page.page.screenshot(path=str(artifacts / f"{stem}-0-opened.png"))

        took, first = page.run_all()
        assert page.problems() == []
        texts = "\n".join(page.output_texts())
        for bad in ("Error displaying widget", "Loading widget", "children=("):
            assert bad not in texts, f"{bad!r} in an output after Run All"

        n = page.explorers()
        assert n >= 1, "no ipywidgets explorer rendered"
        report = []
        for k in range(n):
            ex = page.page.locator(f'[data-explorer="{k}"]')
            controls = ex.locator(".widget-dropdown, .widget-slider, .widget-checkbox, .widget-toggle-buttons, .widget-text")
            assert controls.count() >= 1, f"explorer {k} has no controls"
            cut = ex.evaluate("""e => Array.from(e.querySelectorAll('.widget-label, .widget-label-basic'))
                .filter(l => l.innerText.trim() && l.scrollWidth > l.clientWidth + 1).map(l => l.innerText)""")
            assert cut == [], f"explorer {k}: labels cut off: {cut}"
            ex.scroll_into_view_if_needed()
            ex.screenshot(path=str(artifacts / f"{stem}-1-explorer{k}.png"))
            changed = change_controls(page, ex, figure_png(ex))
            assert changed is not None, f"explorer {k}: no control changed its figure"
            report.append(f"{changed[0]} changed {changed[1]:.0%} of the figure")
            ex.screenshot(path=str(artifacts / f"{stem}-2-explorer{k}-changed.png"))

        # JupyterLab rewrites ../exercises/X.ipynb to /files/exercises/X.ipynb?_xsrf=... and opens it on click
        link = page.cells().locator(f'.jp-RenderedMarkdown a[href*="/files/exercises/{lesson}"]').first
        assert link.count() == 1, f"no link to ../exercises/{lesson}"
        link.scroll_into_view_if_needed()
        link.click()
        page.page.wait_for_function(
            f"() => {{ const w = {PANEL}; return w && w.context.path === 'exercises/{lesson}' && w.context.isReady }}",
            timeout=60_000)
        page.js(f"async () => {{ const w = {PANEL}; await w.sessionContext.shutdown(); w.close(); }}")

        assert page.console == [], f"browser console errors: {page.console[:5]}"
        assert page.external == [], f"requests to the internet: {page.external}"
        line = (f"{stem}: Run All {took:.1f} s, first figure after {'-' if first is None else f'{first:.1f} s'}, "
                f"{n} explorer(s): {'; '.join(report)}")
        (artifacts / f"{stem}-run-all.txt").write_text(line + "\n")
        with capsys.disabled():
            print(f"\n  {line}", end="")
    finally:
        page.shutdown()


def test_exercise_check_feedback_renders(lab, browser, artifacts):
    """exercises/01 as released: Run All completes, the first exercise's check() cell shows ✗ feedback
    (the stub raises NotImplementedError when called); with the solution typed in, it shows ✓."""
    lesson = LESSONS[0]
    sol = json.loads((REPO / "solutions" / lesson).read_text())
    answer = next(c for c in sol["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    grade_id = answer["metadata"]["nbgrader"]["grade_id"]
    page = LabPage(browser, lab, f"exercises/{lesson}").open()
    try:
        page.run_all()
        assert page.problems() == []
        idx = page.js(f"""() => {{ const w = {PANEL}; const cells = w.content.widgets;
            const sol = cells.findIndex(c => ((c.model.getMetadata('nbgrader') || {{}}).grade_id === {json.dumps(grade_id)}) &&
                                              (c.model.getMetadata('nbgrader') || {{}}).solution);
            const chk = cells.findIndex((c, i) => i > sol && c.model.type === 'code' && c.model.sharedModel.getSource().includes('check('));
            return [sol, chk]; }}""")
        sol_idx, check_idx = idx
        assert sol_idx >= 0 and check_idx > sol_idx

        def run_cell(i):
            page.js(f"""async () => {{ const w = {PANEL}; w.content.activeCellIndex = {i};
                await {APP}.commands.execute('notebook:run-cell'); }}""")
            page.wait_idle(60)
            return page.cells().nth(i).locator(".jp-OutputArea").inner_text()

        failed = run_cell(check_idx)
        assert "✓" not in failed and ("✗" in failed or "not attempted" in failed), failed
        page.js(f"() => {PANEL}.content.widgets[{sol_idx}].model.sharedModel.setSource({json.dumps(''.join(answer['source']))})")
        run_cell(sol_idx)
        passed = run_cell(check_idx)
        assert "✓" in passed and "✗" not in passed, passed
        cell = page.cells().nth(check_idx)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(artifacts / f"exercise-{Path(lesson).stem}-check.png"))
        assert page.console == [], f"browser console errors: {page.console[:5]}"
    finally:
        page.shutdown()


def test_make_lab_opens_on_the_lesson_table(browser, tmp_path, artifacts):
    """``make lab``'s flags and environment: the landing page is the README rendered (not its Markdown
    source); its lesson link opens the lesson, the lesson's link its exercises; the two tabs, which
    show the same file name, say "lesson" and "exercises"."""
    flags, env = make_lab_flags()
    with Lab(copy_course(tmp_path), flags=flags, env=env) as lab:
        page = LabPage(browser, lab, "README.md")
        try:
            page.page.goto(lab.url(None))
            page.page.wait_for_function(f"() => {{ const a = {APP}; const w = a && a.shell.currentWidget; "
                                        "return w && w.context && w.context.path === 'README.md' }", timeout=60_000)
            lesson = LESSONS[0]
            for link, path in ((f'a[href*="/files/notebooks/{lesson}"]', f"notebooks/{lesson}"),
                               (f'a[href*="/files/exercises/{lesson}"]', f"exercises/{lesson}")):
                a = page.page.locator(f".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-RenderedMarkdown {link}").first
                a.wait_for(timeout=60_000)
                a.scroll_into_view_if_needed()
                a.click()
                page.page.wait_for_function(f"() => {{ const w = {PANEL}; return w && w.context.path === {json.dumps(path)} "
                                            "&& w.context.isReady }", timeout=60_000)
            page.page.wait_for_function(  # a tab's tooltip (its title attribute) is filled in once the file loads
                f"() => Array.from(document.querySelectorAll('.lm-DockPanel-tabBar .lm-TabBar-tab'))"
                f".some(t => (t.getAttribute('title') || '').includes('Path: exercises/{lesson}'))", timeout=30_000)
            labels = page.js("""() => Object.fromEntries(Array.from(document.querySelectorAll('.lm-DockPanel-tabBar .lm-TabBar-tab'))
                .map(t => [(t.getAttribute('title') || '').split('\\n').find(l => l.startsWith('Path:')),
                           getComputedStyle(t.querySelector('.lm-TabBar-tabLabel'), '::before').content]))""")
            assert labels.get(f"Path: notebooks/{lesson}") == '"lesson · "', labels
            assert labels.get(f"Path: exercises/{lesson}") == '"exercises · "', labels
            page.page.screenshot(path=str(artifacts / "make-lab-tabs.png"))
            assert page.console == [] and page.external == []
        finally:
            page.js(f"async () => {{ for (const s of {APP}.serviceManager.sessions.running()) "
                    f"await {APP}.serviceManager.sessions.shutdown(s.id); }}")
            page.page.close()
