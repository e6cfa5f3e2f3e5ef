"""The course site in a real browser: headless Chromium (Debian's `chromium` package, driven by Playwright) opens
the index, one lesson and the report cards, from disk, on a laptop screen (1280 px) and a phone-width one (390 px),
and checks what a reader would see — every figure loaded, the claims tables there with every verdict and its reason
in view without scrolling sideways or hovering, the lesson's contents leading to its headings (not under the sticky
bar), every link between pages leading to a page, no console error, nothing wider than the screen. Screenshots are
saved under the test's temporary directory, or under $COURSE_SITE_SHOTS when it is set.

Builds lesson 04 in smoke mode (about 40 s on 2 cores), so it runs with `pytest -m extended` (.ci/run, which installs
Chromium); skipped, with the reason, where Chromium is not installed.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import urllib.parse
import urllib.request

import pytest

from devtools import site

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# As root in a container, with no network: no sandbox, and none of Chromium's own calls home (they would fail and
# be logged at every start).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
VIEWPORTS = {"laptop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
# Every verdict and its reason, where a reader sees them: inside the window and inside the box that would scroll
# (the output area of a lesson, the .scroll box of the cards), and that box not scrolling sideways.
IN_VIEW = """sel => [...document.querySelectorAll(sel)].map(e => {
  const r = e.getBoundingClientRect(), box = e.closest('.jp-OutputArea-output, .scroll');
  const b = box ? box.getBoundingClientRect() : {left: 0, right: window.innerWidth};
  return {text: e.textContent.slice(0, 40), width: r.width, height: r.height,
          inside: r.left >= Math.max(0, b.left) - 1 && r.right <= Math.min(window.innerWidth, b.right) + 1,
          sideways: box ? box.scrollWidth - box.clientWidth : 0,
          shown: getComputedStyle(e).visibility !== 'hidden' && getComputedStyle(e).display !== 'none'};
})"""
LESSON = "04"

pytestmark = [
    pytest.mark.extended,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    course = site.build(out, root=ROOT, mode="smoke", lessons=[LESSON], progress=print)
    lesson = next(lesson for lesson in course if lesson.id == LESSON)
    assert lesson.status == "executed", lesson.failure
    return out


def _local_target(href: str) -> pathlib.Path | None:
    """The file a file:// link points to (None for http(s) links, which the site may hold but never loads)."""
    parsed = urllib.parse.urlparse(href)
    if parsed.scheme != "file":
        return None
    return pathlib.Path(urllib.request.url2pathname(parsed.path))


def _all_in_view(page, selector: str, what: str, at_least: int) -> None:
    """Every element ``selector`` finds is shown, has a size, and lies inside the window and its scrolling box,
    which does not scroll sideways; and there are ``at_least`` of them."""
    found = page.evaluate(IN_VIEW, selector)
    assert len(found) >= at_least, f"{what}: {len(found)} found, expected at least {at_least}"
    hidden = [f["text"] for f in found if not (f["shown"] and f["width"] > 0 and f["height"] > 0 and f["inside"])]
    assert not hidden, f"{what}: not in view without scrolling sideways: {hidden[:5]}"
    sideways = max(f["sideways"] for f in found)
    assert sideways <= 1, f"{what}: their box scrolls {sideways}px sideways"


def test_index_lesson_and_cards_in_chromium(built, tmp_path):
    from playwright.sync_api import sync_playwright

    if os.environ.get("COURSE_SITE_SHOTS"):
        tmp_path = pathlib.Path(os.environ["COURSE_SITE_SHOTS"])
        tmp_path.mkdir(parents=True, exist_ok=True)

    lesson_page = next(lesson.page for lesson in site.curriculum(ROOT) if lesson.id == LESSON)
    pages = {"index": "index.html", "lesson": lesson_page, "cards": site.CARDS_PAGE}
    problems: list[str] = []
    shots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for screen, viewport in VIEWPORTS.items():
                page = browser.new_page(viewport=viewport)
                page.on(
                    "console",
                    lambda m, s=screen: (
                        problems.append(f"{s}: console {m.type}: {m.text}") if m.type == "error" else None
                    ),
                )
                page.on("pageerror", lambda e, s=screen: problems.append(f"{s}: page error: {e}"))
                page.on("requestfailed", lambda r, s=screen: problems.append(f"{s}: request failed: {r.url[:120]}"))
                for name, rel in pages.items():
                    page.goto((built / rel).as_uri(), wait_until="load")
                    images = page.eval_on_selector_all(
                        "img",
                        "els => els.map(e => ({ok: e.complete && e.naturalWidth > 0, src: e.src.slice(0, 60), "
                        "alt: e.alt}))",
                    )
                    bad = [i["src"] for i in images if not i["ok"]]
                    assert not bad, f"{name}: figures that did not load: {bad}"
                    undescribed = [i["src"] for i in images if not i["alt"] or i["alt"] == site.NBCONVERT_DEFAULT_ALT]
                    assert not undescribed, f"{name}: figures without a description for a screen reader: {undescribed}"
                    if name == "lesson":
                        assert len(images) >= 2, "lesson 04 draws figures: none on its page"
                        claims = page.locator("table:has(th:text-is('Verdict'))")
                        assert claims.count() >= 1, "no claims table on the lesson page"
                        assert claims.last.locator("tbody tr").count() >= 20  # lesson 04 has 25 claims
                        assert page.locator(".course-banner").count() == 0  # it executed
                        _all_in_view(
                            page, "table.course-claims td.claim-verdict .verdict", f"{screen} lesson verdicts", 20
                        )
                        _all_in_view(
                            page, "table.course-claims td.claim-verdict .reason", f"{screen} lesson reasons", 1
                        )
                        toc = page.locator("nav.course-toc a")
                        assert toc.count() >= 6, "no contents list on the lesson page"
                        target = toc.nth(2).get_attribute("href")
                        toc.nth(2).click()
                        assert page.url.endswith(target)
                        page.wait_for_timeout(300)
                        top = page.evaluate("id => document.getElementById(id).getBoundingClientRect().top", target[1:])
                        bar = page.locator("nav.course-nav").bounding_box()
                        assert bar["y"] + bar["height"] - 1 <= top < viewport["height"] / 2, (
                            f"the heading {target} is at {top}px: under the sticky bar or not scrolled to"
                        )
                        shot = tmp_path / f"{screen}-lesson-contents-jump.png"
                        page.screenshot(path=str(shot))
                        page.evaluate("window.scrollTo(0, 0)")
                    if name == "cards":
                        cards = page.locator("table.cards")
                        assert cards.count() == 1 and cards.locator("span.verdict").count() >= 1
                        assert cards.locator("thead th").count() >= 3  # the claim, a card, a "not measured yet"
                        _all_in_view(page, "table.cards span.verdict", f"{screen} card verdicts", 20)
                        _all_in_view(page, "table.cards span.reason", f"{screen} card reasons", 5)
                        assert not page.locator("table.cards [title]").count()  # nothing only a hover shows
                    if name == "index":
                        assert page.locator("table.course tbody tr").count() == 8
                    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
                    targets = [t for t in map(_local_target, hrefs) if t is not None]
                    assert targets, f"{name}: no link to another page of the site"
                    missing = sorted({str(t) for t in targets if not t.is_file()})
                    assert not missing, f"{name}: links to pages that do not exist: {missing}"
                    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    assert overflow <= 1, f"{name} on a {screen} screen is {overflow}px wider than the screen"
                    shot = tmp_path / f"{screen}-{name}.png"
                    page.screenshot(path=str(shot))
                    shots.append(shot)
                    if name == "lesson":  # the end of the lesson: its claims table
                        page.locator("table:has(th:text-is('Verdict'))").last.scroll_into_view_if_needed()
                        page.screenshot(path=str(tmp_path / f"{screen}-lesson-claims.png"))
                # the links between pages resolve in the browser too: follow the lesson's navigation home
                page.goto((built / lesson_page).as_uri(), wait_until="load")
                page.locator("nav.course-nav a", has_text="Report cards").click()
                assert page.url.endswith(site.CARDS_PAGE)
                page.locator("nav.course-nav a", has_text="Course home").click()
                assert page.url.endswith("index.html")
                page.close()
        finally:
            browser.close()
    print(f"screenshots: {tmp_path}")
    assert not problems, problems
    assert all(shot.stat().st_size > 10_000 for shot in shots)
