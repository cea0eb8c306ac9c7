"""The course website (``make book`` → ``build/book/html``) in a real browser, as a reader meets it.

The site is served from a loopback HTTP server (as GitHub Pages serves it) and every page is opened in
headless Chromium. On every page: no console error and no failed request; nothing is fetched from another
host (the math renderer, fonts and images are local); every image loaded (natural width > 0); every formula
typeset by MathJax and no raw ``$…$`` or TeX command left in the visible text (code excluded); every internal
link points at a page that exists and every ``#anchor`` at an element of that page. Across the site: the
lessons in course order in the navigation, and previous/next going lesson NN → its exercises → lesson NN+1;
each lesson's and exercise page's Colab link opening that notebook at the release tag
(:func:`attn_course._colab.colab_url`), its download link serving the committed notebook byte for byte,
and each explorer picture carrying its "live in Jupyter" note; search finds a lesson. Screenshots of three
pages go to ``build/book/screenshots/``.

Run ``make book`` first (``make test-book`` does both). The pages come from the notebooks found by glob, so
a new lesson is tested without changing this file.
"""
from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from attn_course import _colab

from .lab import REPO

SITE = REPO / "build" / "book" / "html"
SHOTS = REPO / "build" / "book" / "screenshots"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LESSONS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted(p.name for p in (REPO / "exercises").glob("[0-9][0-9]_*.ipynb"))
# TeX left untypeset in the visible text: $…$ / $$…$$ pairs, \(…\) / \[…\] delimiters, common commands
RAW_MATH = re.compile(r"\$\$|\$[^$\s][^$]*?\$|\\\(|\\\[|\\(frac|sqrt|mathrm|mathbf|top|sum|left|right|cdot|begin)\b")

# Text nodes a reader sees as prose: not code (nor an API signature), not typeset math, not scripts
VISIBLE_TEXT = """() => {
  const skip = 'pre, code, .highlight, .sig, mjx-container, script, style, .MathJax, mjx-assistive-mml';
  const out = [];
  const walker = document.createTreeWalker(document.querySelector('article') || document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.parentElement.closest(skip)) out.push(n.nodeValue);
  }
  return out.join(' ');
}"""

MATH_STATE = """async () => {
  const maths = document.querySelectorAll('span.math, div.math');
  if (maths.length && !(window.MathJax && MathJax.startup)) return {count: maths.length, untypeset: maths.length, loaded: false};
  if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
  const bad = Array.from(maths).filter(m => !m.querySelector('mjx-container') || m.querySelector('mjx-merror'));
  return {count: maths.length, untypeset: bad.length, first: bad.length ? bad[0].textContent.slice(0, 80) : null, loaded: true};
}"""

IMAGES = """() => Array.from(document.images).map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0}))"""


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k == "id" or (tag == "a" and k == "name"):
                self.ids.add(v)


@functools.lru_cache(maxsize=None)
def ids_of(path: Path) -> frozenset[str]:
    p = _Ids()
    p.feed(path.read_text(encoding="utf-8"))
    return frozenset(p.ids)


def _pages() -> list[str]:
    """Every HTML page of the site, as a path relative to its root (the theme's own files excluded)."""
    if not (SITE / "index.html").is_file():
        return []
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html") if not p.relative_to(SITE).parts[0] == "_static")


PAGES = _pages()


@pytest.fixture(scope="module")
def site():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no site at {SITE}: run `make book` first (`make test-book` builds and tests it)")
    return SITE


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class SitePage:
    """One browser tab on the site that records console errors, failed requests and off-site requests."""

    def __init__(self, browser, base: str):
        self.base = base
        self.page = browser.new_page(viewport={"width": 1300, "height": 900})
        self.errors: list[str] = []
        self.offsite: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} ({r.failure})")
                     if not r.url.startswith(("data:", "blob:")) and r.url not in self.offsite else None)
        self.page.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
        self.page.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        if url.startswith((self.base, "data:", "blob:")):
            route.continue_()
        else:                                              # the site must not need the internet
            self.offsite.append(url)
            route.abort()

    def goto(self, rel: str):
        self.errors.clear()
        self.offsite.clear()
        self.page.goto(self.base + rel, wait_until="load")
        return self

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def links(self) -> list[dict]:
        return self.js("() => Array.from(document.querySelectorAll('a[href]')).map(a => ({href: a.getAttribute('href'),"
                       " abs: a.href, text: a.textContent.trim(), cls: a.className}))")


@pytest.fixture(scope="module")
def tab(browser, server):
    t = SitePage(browser, server)
    yield t
    t.page.close()


def _target(base: str, page_url: str, href: str) -> tuple[Path, str] | None:
    """The file and fragment an internal link points at, or None for an external one."""
    url = urljoin(page_url, href)
    if not url.startswith(base):
        return None
    parts = urlsplit(url)
    rel = unquote(parts.path[len(urlsplit(base).path):])
    path = SITE / rel
    if rel == "" or rel.endswith("/"):
        path = path / "index.html"
    return path, parts.fragment


@pytest.mark.parametrize("rel", PAGES or ["index.html"])
def test_every_page_is_clean(rel, tab, server):
    """No console error, failed or off-site request; images loaded; math typeset; internal links and anchors resolve."""
    tab.goto(rel)
    math = tab.js(MATH_STATE)
    assert math["untypeset"] == 0, f"{rel}: {math['untypeset']} of {math['count']} formulas not typeset ({math})"
    images = tab.js(IMAGES)
    assert all(i["ok"] for i in images), f"{rel}: images not loaded: {[i['src'] for i in images if not i['ok']]}"
    text = tab.js(VISIBLE_TEXT)
    raw = sorted({m.group(0) for m in RAW_MATH.finditer(text)})
    assert not raw, f"{rel}: raw TeX in the visible text: {raw[:10]}"
    page_url = server + rel
    broken = []
    for link in tab.links():
        href = link["href"]
        if href.startswith(("mailto:", "javascript:")):
            continue
        target = _target(server, page_url, href)
        if target is None:
            assert href.startswith("https://"), f"{rel}: a link that is neither internal nor https: {href}"
            continue
        path, fragment = target
        if not path.is_file():
            broken.append(f"{href} (no {path.relative_to(SITE)})")
        elif fragment and path.suffix == ".html" and unquote(fragment) not in ids_of(path):
            broken.append(f"{href} (no #{fragment} in {path.relative_to(SITE)})")
    assert not broken, f"{rel}: broken links: {broken}"
    tab.page.wait_for_timeout(50)                      # late console messages
    assert not tab.offsite, f"{rel}: fetched from another host: {tab.offsite}"
    assert not tab.errors, f"{rel}: {tab.errors}"


# Code blocks, tables and display math against the text column, at a wide screen and at a phone's width
LAYOUT = """() => {
  const pres = Array.from(document.querySelectorAll('div.cell pre, div.highlight pre'));
  const scrolls = pres.filter(p => p.scrollWidth > p.clientWidth + 2);
  const col = document.querySelector('article').getBoundingClientRect();
  const tables = Array.from(document.querySelectorAll('article table')).map(t => {
    const w = t.closest('.table-wrapper');
    return {fits: t.getBoundingClientRect().width <= (w ? w.clientWidth : col.width) + 2,
            marked: !!w && w.classList.contains('scrolls-x') && getComputedStyle(w).overflowX === 'auto'
                    && getComputedStyle(w, '::before').content.includes('scroll sideways')};
  });
  const maths = Array.from(document.querySelectorAll('mjx-container[display="true"]'))
    .filter(m => m.scrollWidth > m.clientWidth + 1 && getComputedStyle(m).overflowX !== 'auto');
  return {blocks: pres.length, scrolls: scrolls.length, column: Math.round(col.width),
          first: scrolls.slice(0, 3).map(p => p.textContent.split('\\n').sort((a, b) => b.length - a.length)[0].slice(0, 80)),
          tables, clipped_math: maths.length, page_width: document.documentElement.scrollWidth};
}"""
NOTEBOOK_PAGES = [f"notebooks/{n[:-6]}.html" for n in LESSONS] + [f"exercises/{n[:-6]}.html" for n in EXERCISES]


@pytest.mark.parametrize("rel", NOTEBOOK_PAGES)
def test_code_and_tables_fit_the_column_wide_and_on_a_phone(rel, tab):
    """Review 2026-11-26 (reader §4): at 1400 px Furo's 736-px column made 54-74 % of a lesson's code blocks
    scroll sideways, lesson 08's benchmark table hid its last column without a hint, and at phone width the first
    display equation was cut off. Now (docs/_static/course.css, course.js), on every lesson and exercise page: at
    most 10 % of the code blocks scroll sideways at 1400 px (the column is wider, and long lines wrap as in
    JupyterLab); every table fits, or scrolls inside its frame with a visible "scroll sideways" line; at 420 px the
    page itself never scrolls sideways and a wide display formula scrolls inside its own box."""
    tab.goto(rel)
    try:
        tab.page.set_viewport_size({"width": 1400, "height": 900})
        tab.page.wait_for_timeout(100)
        wide = tab.js(LAYOUT)
        assert wide["column"] >= 840, f"{rel}: text column only {wide['column']} px at 1400 px"
        assert wide["scrolls"] <= 0.10 * wide["blocks"], (
            f"{rel}: {wide['scrolls']} of {wide['blocks']} code blocks scroll sideways at 1400 px: {wide['first']}")
        assert all(t["fits"] or t["marked"] for t in wide["tables"]), f"{rel}: a table is cut at 1400 px: {wide['tables']}"
        tab.page.set_viewport_size({"width": 420, "height": 900})
        tab.page.wait_for_timeout(100)
        phone = tab.js(LAYOUT)
        assert phone["page_width"] <= 420, f"{rel}: the page scrolls sideways at 420 px ({phone['page_width']} px)"
        assert all(t["fits"] or t["marked"] for t in phone["tables"]), f"{rel}: a table is cut at 420 px: {phone['tables']}"
        assert phone["clipped_math"] == 0, f"{rel}: {phone['clipped_math']} display formulas cut at 420 px"
        print(f"{rel}: {wide['scrolls']}/{wide['blocks']} code blocks scroll at 1400 px (column {wide['column']} px); "
              f"{sum(not t['fits'] for t in phone['tables'])} of {len(phone['tables'])} tables scroll at 420 px")
    finally:
        tab.page.set_viewport_size({"width": 1300, "height": 900})


def _page_of(notebook: str) -> str:
    return notebook[:-len(".ipynb")] + ".html"


def _explorers(notebook: Path) -> int:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return sum(WIDGET_VIEW in o.get("data", {}) and "image/png" in o.get("data", {})
               for c in nb["cells"] for o in c.get("outputs", []))


def _download(tab, rel: str, text: str) -> bytes:
    """The bytes served by the page's download link whose text contains ``text``."""
    hrefs = [l["abs"] for l in tab.links() if text in l["text"] and "_downloads/" in l["href"]]
    assert hrefs, f"{rel}: no download link for {text!r}"
    target = _target(tab.base, tab.base + rel, hrefs[0])
    assert target is not None and target[0].is_file(), hrefs[0]
    return target[0].read_bytes()


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_page_links_its_notebooks(lesson, tab):
    """The lesson page: Colab and download links of the lesson, its exercises page, Colab and download
    links of its exercises, and a "live in Jupyter" note above each explorer picture."""
    rel = _page_of(f"notebooks/{lesson}")
    tab.goto(rel)
    hrefs = {l["href"] for l in tab.links()}
    assert _colab.colab_url(f"notebooks/{lesson}") in hrefs, f"{rel}: no Colab link to the lesson"
    assert _download(tab, rel, "download the notebook") == (REPO / "notebooks" / lesson).read_bytes()
    if lesson in EXERCISES:
        assert f"../exercises/{_page_of(lesson)}" in hrefs, f"{rel}: no link to its exercises page"
        assert _colab.colab_url(f"exercises/{lesson}") in hrefs, f"{rel}: no Colab link to its exercises"
        downloads = [l for l in tab.links() if "_downloads/" in l["href"] and l["href"].endswith(f"/{lesson}")]
        served = {_target(tab.base, tab.base + rel, l["href"])[0].read_bytes() for l in downloads}
        assert (REPO / "exercises" / lesson).read_bytes() in served, f"{rel}: no download of exercises/{lesson}"
    notes = tab.js("() => Array.from(document.querySelectorAll('.explorer-note')).map(n => {"
                   " const out = n.closest('.cell_output') || n.parentElement;"
                   " const img = out.querySelector('img'); return !!img && img.complete && img.naturalWidth > 0 })")
    want = _explorers(REPO / "notebooks" / lesson)
    assert len(notes) == want and all(notes), f"{rel}: {len(notes)} explorer notes with pictures, want {want}"
    if want:
        assert "live" in tab.page.locator(".explorer-note").first.inner_text().lower()


@pytest.mark.parametrize("exercises", EXERCISES)
def test_exercise_page_is_read_only_with_download_and_colab(exercises, tab):
    rel = _page_of(f"exercises/{exercises}")
    tab.goto(rel)
    hrefs = {l["href"] for l in tab.links()}
    assert _colab.colab_url(f"exercises/{exercises}") in hrefs, f"{rel}: no Colab link"
    assert _download(tab, rel, "download the notebook") == (REPO / "exercises" / exercises).read_bytes()
    assert "read-only" in tab.page.locator(".exercises-note").inner_text().lower()
    if exercises in LESSONS:
        assert f"../notebooks/{_page_of(exercises)}" in hrefs, f"{rel}: no link back to the lesson"


def test_navigation_is_in_course_order(tab):
    """The sidebar lists the lessons in order; next/previous walk lesson NN, its exercises, lesson NN+1 …"""
    tab.goto("index.html")
    sidebar = [l["href"] for l in tab.js("() => Array.from(document.querySelectorAll('.sidebar-tree a'))"
                                          ".map(a => ({href: a.getAttribute('href')}))")]
    lessons_in_nav = [h for h in sidebar if h.startswith("notebooks/")]
    assert lessons_in_nav == [_page_of(f"notebooks/{l}") for l in LESSONS]
    numbers = [l[:2] for l in sorted(set(LESSONS) | set(EXERCISES))]
    want = []
    for n in numbers:
        want += [_page_of(f"{folder}/{name}") for folder, names in (("notebooks", LESSONS), ("exercises", EXERCISES))
                 for name in names if name[:2] == n]
    walked, rel = [], "index.html"
    for _ in range(len(PAGES) + 1):
        tab.goto(rel)
        nxt = tab.js("() => { const a = document.querySelector('a.next-page'); return a ? a.href : null }")
        if nxt is None:
            break
        came_from, rel = rel, nxt[len(tab.base):]
        walked.append(rel)
        tab.goto(rel)
        prev = tab.js("() => { const a = document.querySelector('a.prev-page'); return a ? a.href : null }")
        assert prev == tab.base + came_from, f"{rel}: previous is {prev}, want {came_from}"
    course = [r for r in walked if r.startswith(("notebooks/", "exercises/"))]
    assert course == want, f"next/previous order: {course}"
    assert walked[:len(want)] == want, "the lessons come first after the landing page"


def test_landing_page_table_links_every_lesson_and_colab(tab):
    tab.goto("index.html")
    hrefs = [l["href"] for l in tab.links()]
    for lesson in LESSONS:
        assert _page_of(f"notebooks/{lesson}") in hrefs, lesson
        assert _colab.colab_url(f"notebooks/{lesson}") in hrefs, lesson
    for ex in EXERCISES:
        assert _page_of(f"exercises/{ex}") in hrefs, ex
        assert _colab.colab_url(f"exercises/{ex}") in hrefs, ex
    for page in ("docs/grading.html", "docs/exercises.html", "docs/api.html"):
        assert page in hrefs, page
    if (REPO / "docs" / "sources.md").exists():
        assert "docs/sources.html" in hrefs


def test_search_finds_a_lesson(tab):
    tab.goto("search.html?q=multi-head")
    tab.page.wait_for_selector("#search-results li", timeout=20_000)
    found = tab.js("() => Array.from(document.querySelectorAll('#search-results li a')).map(a => a.getAttribute('href'))")
    assert any("02_multi_head_attention" in h for h in found), found
    assert not tab.errors and not tab.offsite


def test_api_reference_documents_the_package(tab):
    tab.goto("docs/api.html")
    ids = ids_of(SITE / "docs" / "api.html")
    for name in ("attn_course.functional.attention", "attn_course.mha.MultiHeadAttention", "attn_course.grading.check"):
        assert name in ids, name


def test_screenshots_of_three_pages(tab):
    """The landing page, lesson 01 at its first explorer (a typeset formula above it) and exercises 01."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    shots = {"landing.png": ("index.html", None),
             "lesson.png": (_page_of(f"notebooks/{LESSONS[0]}"), ".explorer-note"),
             "exercises.png": (_page_of(f"exercises/{EXERCISES[0]}"), ".exercises-note")}
    for name, (rel, selector) in shots.items():
        tab.goto(rel)
        tab.js(MATH_STATE)
        if selector:
            tab.page.locator(selector).first.scroll_into_view_if_needed()
            tab.js("() => window.scrollBy(0, -120)")
        tab.page.screenshot(path=str(SHOTS / name))
        assert (SHOTS / name).stat().st_size > 10_000, name
