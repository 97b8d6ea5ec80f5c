"""The web page in a real browser: headless Chromium (Debian's ``chromium`` package) driven
by Playwright against the real stack, as ``make serve`` runs it (``python -m
service.stack.launch``: the first-start bootstrap, the embedded Celery worker under its
supervisor, and the gateway), on a temporary data directory with the embedded broker, a
micro v1 and 40 small synthetic images, so that every job runs for real in seconds.

Nothing is mocked: every form of the page is submitted to the real gateway and the real
worker runs what it queues. Search by text and by image (thumbnails that actually loaded),
the models page (lineage, the active version, a gate report's heatmap, promote and roll
back), every job kind the jobs form offers (each accepted by the API and run by the
worker to its end, live progress and cancel), and a gallery's migration (start, switch,
roll back, retire) whose backfill the worker runs, and an upgrade plan (the form, its
progress, its chart and table of options drawn from a plan computed for real, applying
its options, stale or not). Also what a new user meets on first open: no request of the
page fails (a 404 favicon was one) and the galleries are preselected once the page knows
them.

Set NOBACKFILL_WEB_SCREENSHOTS=dir to keep a full-page screenshot of each test.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import ADMIN, ADMIN_KEY, MICRO_CONFIG, MICRO_PREPROCESS, micro_model
from PIL import Image
from test_service_api import b64, png

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported by require_browser() as a failure, not a collection error
    expect = sync_playwright = None  # type: ignore[assignment]

from service.stack.launch import REPO, child_env, free_port, stop
from training.data import write_dataset
from training.encoders import ModelSpec

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
GALLERY = "demo"  # the bootstrap's gallery
WORLD = 40  # items the bootstrap ingests into it
ODD_ID = "odd/id 100% ü"  # a slash, a percent sign and non-ASCII, all through real URLs
TIMEOUT_MS = 10_000
JOB_MS = 180_000  # a job, from the form to its end (each starts a fresh worker child)
READY_S = 240


def cell(t2i: float, i2t: float) -> dict[str, Any]:
    return {"t2i": {"R@1": t2i, "R@5": min(1.0, t2i + 0.1)},
            "i2t": {"R@1": i2t, "R@5": min(1.0, i2t + 0.1)}, "rm": (t2i + i2t) / 2}


# A gate report as training jobs write it: the page must draw its matrix.
GATE = {"passed": True, "criterion": {"metric": "R@1", "margin": 0.0, "retention_limit": 0.02},
        "matrix": {"models": ["v1", "v1.1", "v3"], "cells": {
            "v1": {"v1": cell(0.80, 0.70), "v1.1": cell(0.78, 0.69), "v3": None},
            "v1.1": {"v1": cell(0.85, 0.75), "v1.1": cell(0.88, 0.79), "v3": None},
            "v3": {"v1": None, "v1.1": None, "v3": cell(0.92, 0.90)}}},
        "negative_flip": {"t2i": 0.031, "i2t": 0.0}, "max_negative_flip": None}


@dataclass(frozen=True)
class Stack:
    url: str
    data: Path  # NOBACKFILL_DATA_DIR
    world: Path  # the dataset the bootstrap ingested into 'demo' (the jobs' data too)
    extra: Path  # six more items, for the ingest job
    log: Path  # the stack's output (bootstrap, supervisor, worker, gateway)

    @property
    def registry_dir(self) -> Path:
        return self.data / "registry"

    def image(self, n: int) -> tuple[str, Path]:
        """The id and image file of the world's n-th item, as the bootstrap ingested it."""
        row = json.loads((self.world / "manifest.jsonl").read_text().splitlines()[n])
        return row["id"], self.world / row["image"]

    def caption(self, n: int) -> str:
        row = json.loads((self.world / "manifest.jsonl").read_text().splitlines()[n])
        return row["captions"]["en"][0]

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """An admin call that must succeed; its JSON."""
        r = httpx.request(method, self.url + path, headers=ADMIN, timeout=60, **kwargs)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()


def child_version(root: Path, version_id: str, parent: Path, seed: int | None) -> Path:
    """A micro artifact "trained" from the artifact at ``parent``: random weights (only the
    lineage matters), or with ``seed`` None the parent's own (it retrieves exactly like
    it, so a real gate against it passes)."""
    from training.artifacts import WEIGHTS, load_artifact, model_state, write_artifact
    from training.encoders import create_model

    spec = ModelSpec(config=json.loads(json.dumps(MICRO_CONFIG)),
                     preprocess=dict(MICRO_PREPROCESS))
    origin = load_artifact(parent)
    if seed is None:
        weights = origin.tensors(WEIGHTS)
    else:
        torch.manual_seed(seed)
        weights = model_state(create_model(spec))
    manifest = {"version_id": version_id, "space": "v1", "model_spec": spec.to_dict(),
                "embed_dim": 32, "kind": "continual", "parent": origin.version_id}
    return write_artifact(root / version_id, manifest, {WEIGHTS: weights}).path


def stack_env(data: Path, world: Path, v1: Path) -> dict[str, str | None]:
    """``make serve``'s settings for the test: its own data directory (so its embedded
    broker, registry and Qdrant are its own), an admin key, a micro v1 and the world as the
    bootstrap's model and gallery, short intervals so that the page sees changes soon."""
    return {"NOBACKFILL_DATA_DIR": str(data),
            "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"ops": ADMIN_KEY}),
            "NOBACKFILL_READ_API_KEY": None,  # search is public, as on a fresh `make serve`
            "NOBACKFILL_BROKER_URL": None, "NOBACKFILL_RESULT_BACKEND": None,  # embedded
            "NOBACKFILL_QDRANT_URL": None, "NOBACKFILL_REGISTRY_ROOT": None,
            "NOBACKFILL_DATASETS_DIR": None, "NOBACKFILL_ALLOWED_ROOTS": None,
            "NOBACKFILL_BOOTSTRAP": "true", "NOBACKFILL_BOOTSTRAP_MODEL": str(v1),
            "NOBACKFILL_BOOTSTRAP_DATA": str(world), "NOBACKFILL_BOOTSTRAP_IMAGES": str(WORLD),
            "NOBACKFILL_HOST": "127.0.0.1", "NOBACKFILL_PORT": str(free_port()),
            "NOBACKFILL_DEVICE": "cpu", "NOBACKFILL_ACCESS_LOG": "false",
            "NOBACKFILL_REGISTRY_POLL_INTERVAL_S": "0.2", "NOBACKFILL_APPLY_INTERVAL_S": "0.2",
            "NOBACKFILL_JOB_HEARTBEAT_S": "0.3", "NOBACKFILL_WORKER_HEARTBEAT_S": "1",
            "NOBACKFILL_MIGRATION_RATE_LIMIT": None,
            "OMP_NUM_THREADS": "1"}


def wait_stack(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the gateway is ready and has seen the embedded worker's liveness record."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the stack exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{url}/readyz", headers=ADMIN, timeout=5)
            if r.status_code == 200 and r.json().get("workers"):
                return
        time.sleep(0.3)
    pytest.fail(f"the stack was not ready with a worker after {READY_S}s:\n{tail(log)}")


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop_stack(proc: subprocess.Popen, log: Path) -> None:
    """SIGTERM to the launcher, which stops its worker too (``make serve``'s Ctrl-C); any
    worker it started that is still alive afterwards is stopped by its logged pid."""
    stop(proc, 60)
    for pid in re.findall(r"embedded worker started \(pid (\d+)\)", log.read_text()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), 9)  # its own session: the group is the worker and its pool


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory,
          micro_versions: dict[str, Path]) -> Iterator[Stack]:
    """``python -m service.stack.launch`` on a fresh data directory: the bootstrap registers
    the micro v1 and ingests the world into 'demo' (v1's space, with the bootstrap's
    validation set); v3 (another space), v1.1 (v1's weights; a gate report with a matrix)
    and v1.2 (under v1.1, random weights; its gate failed) are registered beside it, and
    'demo' also holds an item with an odd id."""
    from service.state.registry import Registry

    root = tmp_path_factory.mktemp("stack")
    data = root / "data"
    datasets = data / "datasets"  # the default allowed root of the jobs' paths
    write_dataset(datasets / "world", WORLD, seed=21, languages=("en",), image_size=32)
    write_dataset(datasets / "extra", 6, seed=22, languages=("en",), image_size=32,
                  id_prefix="x-")
    env = stack_env(data, datasets / "world", micro_versions["v1"])
    log = root / "stack.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.stack.launch"],
                                env=child_env(env), cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{env['NOBACKFILL_PORT']}"
        wait_stack(url, proc, log)
        # The gate reports stand in for gates the service ran (a manifest's is never trusted).
        registry = Registry(data / "registry")
        registry.register(micro_versions["v3"], by="fixture")
        v11 = child_version(root / "art", "v1.1", micro_versions["v1"], None)
        registry.register(v11, by="fixture", gate=GATE)
        registry.register(child_version(root / "art", "v1.2", v11, 12), by="fixture",
                          gate={"passed": False})
        stack = Stack(url, data, datasets / "world", datasets / "extra", log)
        odd = {"id": ODD_ID, "image_base64": b64(png(Image.new("RGB", (50, 30), "gold")))}
        assert stack.api("POST", f"/v1/galleries/{GALLERY}/items",
                         json={"items": [odd]})["count"] == 1
        yield stack
    finally:
        stop_stack(proc, log)


def require_browser() -> None:
    """Fail (never skip): CI installs Chromium and Playwright, so a missing one is a broken
    setup, not a reason to pass without testing the page."""
    if sync_playwright is None:
        pytest.fail("the Python package `playwright` is missing: `pip install -e '.[dev]'` "
                    "(never `playwright install`: the test uses Debian's Chromium)",
                    pytrace=False)
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser tests need Debian's Chromium; "
                    "run `apt-get install -y chromium` (and `pip install playwright`, "
                    "without `playwright install`)", pytrace=False)


def test_browser_is_installed() -> None:
    require_browser()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        yield chromium
        chromium.close()


@dataclass
class Tab:
    """A browser tab and what went wrong in it: uncaught errors, CSP violations, requests
    answered >= 400 and resources the browser could not load (a favicon's 404 is seen only
    as a console error: the browser fetches it outside the page's own requests)."""

    page: Any
    errors: list[str]
    failed: list[str]
    console: list[str]


def open_tab(browser: Any) -> Tab:
    context = browser.new_context(viewport={"width": 1366, "height": 850})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    tab = Tab(page, [], [], [])
    page.on("pageerror", lambda exc: tab.errors.append(f"uncaught: {exc}"))
    page.on("response", lambda r: tab.failed.append(f"{r.status} {r.url}")
            if r.status >= 400 else None)
    page.on("console", lambda msg: tab.console.append(msg.text)
            if msg.type == "error" else None)
    return tab


@pytest.fixture
def tab(browser: Any, stack: Stack, request: pytest.FixtureRequest) -> Iterator[Tab]:
    """A fresh tab (own sessionStorage and localStorage) on a laptop-sized window; fails
    on any JS error or Content-Security-Policy violation."""
    opened = open_tab(browser)
    yield opened
    shots = os.environ.get("NOBACKFILL_WEB_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        opened.page.screenshot(path=str(Path(shots) / f"{request.node.name}.png"),
                               full_page=True)
    opened.page.context.close()
    assert opened.errors == []
    assert [m for m in opened.console if "Content Security Policy" in m] == []


@pytest.fixture
def page(tab: Tab) -> Any:
    return tab.page


def use_key(page: Any, key: str = ADMIN_KEY) -> None:
    page.fill("#api-key", key)
    page.click("#key-form button[type=submit]")
    expect(page.locator("#key-state")).to_have_text("key set")


def wait_thumbnails_loaded(page: Any, count: int) -> None:
    """Every result card's <img> really decoded a picture (naturalWidth > 0)."""
    page.wait_for_function("""(count) => {
        const imgs = [...document.querySelectorAll('#results figure.card img.thumb')];
        return imgs.length === count && imgs.every((i) => i.complete && i.naturalWidth > 0);
    }""", arg=count)


# ---------------------------------------------------------------- first open
def test_first_open_requests_nothing_that_fails(tab: Tab, stack: Stack) -> None:
    """Every resource the page asks for answers: the page, its assets, its icon (the
    browser asks for /favicon.ico, a 404, when the page names none), and the API calls,
    before and after the key is set, on every tab."""
    page = tab.page
    page.goto(f"{stack.url}/")
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(500)  # an icon fetched late still reports
    assert (tab.failed, [m for m in tab.console if "Failed to load resource" in m]) == ([], [])
    assert page.evaluate("() => document.querySelector('link[rel~=icon]').href") == \
        f"{stack.url}/web/favicon.svg"
    use_key(page)
    for name in ("models", "jobs", "search"):
        page.click(f"nav a[data-tab={name}]")
        page.wait_for_load_state("networkidle")
    expect(page.locator("#gallery")).to_have_value(GALLERY)
    assert tab.failed == []
    assert [m for m in tab.console if "Failed to load resource" in m] == []


def test_galleries_are_preselected_once_the_page_knows_them(browser: Any,
                                                            stack: Stack) -> None:
    """A new user sets the key on whichever tab they opened: both gallery pickers get the
    first gallery. A gallery remembered from an earlier visit that no longer exists is
    replaced; a name the person typed is left alone."""
    first = stack.api("GET", "/v1/galleries")[0]["name"]
    tab = open_tab(browser)
    page = tab.page
    try:
        page.goto(f"{stack.url}/#jobs")
        expect(page.locator("#jobs-status.error")).to_contain_text("admin key")
        assert page.input_value("#gallery") == ""  # no key: the page knows no gallery
        use_key(page)
        expect(page.locator("#job-form input[name=gallery]")).to_have_value(first)
        expect(page.locator("#gallery")).to_have_value(first)
        assert page.locator("#gallery-options option").count() >= 1

        # Another visit: the page remembers the gallery of the last search, gone since.
        page.evaluate("() => localStorage.setItem('nobackfill.gallery', 'gone-since')")
        page.goto(f"{stack.url}/#search")
        page.reload()  # the key stays for the tab (sessionStorage)
        expect(page.locator("#key-state")).to_have_text("key set")
        expect(page.locator("#gallery")).to_have_value(first)

        page.fill("#gallery", "typed-by-hand")
        use_key(page)  # reloads the galleries
        expect(page.locator("#gallery-options option")).not_to_have_count(0)
        page.wait_for_load_state("networkidle")
        assert page.input_value("#gallery") == "typed-by-hand"
        assert tab.errors == []
    finally:
        page.context.close()


# ---------------------------------------------------------------- search
def test_text_search_shows_loaded_thumbnails(page: Any, stack: Stack) -> None:
    demo = stack.api("GET", f"/v1/galleries/{GALLERY}")
    page.goto(f"{stack.url}/#search")
    page.fill("#gallery", GALLERY)
    page.fill("#query-text", stack.caption(3))
    page.fill("#top-k", "8")
    page.click("#search-form button[type=submit]")
    page.wait_for_selector("#results figure.card")
    assert page.locator("#results figure.card").count() == 8
    wait_thumbnails_loaded(page, 8)
    meta = {f: page.text_content(f"#search-meta [data-field={f}]")
            for f in ("gallery", "version", "route", "space", "kind")}
    assert meta == {"gallery": GALLERY, "version": demo["active"], "route": "native",
                    "space": "v1", "kind": "image"}
    scores = [float(s.split()[-1]) for s in page.locator("#results .score").all_text_contents()]
    assert scores == sorted(scores, reverse=True)


def test_image_upload_shows_results(page: Any, stack: Stack, tmp_path: Path) -> None:
    item, image = stack.image(0)
    page.goto(f"{stack.url}/")
    page.fill("#gallery", GALLERY)
    page.fill("#top-k", "17")
    page.set_input_files("#query-image", str(image))  # searches on change
    page.wait_for_selector(f"#results figure.card[data-id='{item}']")
    first = page.locator("#results figure.card").first
    assert first.get_attribute("data-id") == item  # the very image the bootstrap ingested
    assert float(first.locator(".score").text_content().split()[-1]) == pytest.approx(1, abs=1e-3)
    wait_thumbnails_loaded(page, 17)
    assert page.is_visible("#query-preview")
    # The odd id's own picture finds it; its thumbnail URL survives the round trip.
    gold = tmp_path / "gold.png"
    gold.write_bytes(png(Image.new("RGB", (50, 30), "gold")))
    page.set_input_files("#query-image", str(gold))
    expect(page.locator("#results figure.card").first).to_have_attribute("data-id", ODD_ID)
    wait_thumbnails_loaded(page, 17)
    # With a key set, thumbnails are fetched with the header and shown from blob: URLs.
    use_key(page)
    page.click("#search-form button[type=submit]")
    page.wait_for_function("""() => [...document.querySelectorAll('#results img.thumb')]
        .some((i) => i.src.startsWith('blob:'))""")
    wait_thumbnails_loaded(page, 17)


def test_search_errors_show_the_server_message(page: Any, stack: Stack) -> None:
    page.goto(f"{stack.url}/")
    page.fill("#gallery", "no-such-gallery")
    page.fill("#query-text", "a red circle")
    page.click("#search-form button[type=submit]")
    page.wait_for_selector("#search-status.error")
    assert "no-such-gallery" in page.text_content("#search-status")


# ---------------------------------------------------------------- models
def test_models_page_shows_lineage_active_version_and_gate(page: Any, stack: Stack) -> None:
    active_now = stack.api("GET", f"/v1/galleries/{GALLERY}")["active"]
    page.goto(f"{stack.url}/#models")
    page.wait_for_selector("#models-status.error")  # admin view: asks for the key first
    use_key(page)
    active = page.wait_for_selector(f"#galleries tr[data-gallery={GALLERY}] .active-version")
    assert active.text_content() == active_now
    # Lineage: v1.1 under v1, v1.2 under v1.1, v3 a root of its own.
    roots = page.locator("#lineage > ul > li > button.node").evaluate_all(
        "nodes => nodes.map((n) => n.dataset.version)")
    assert {"v1", "v3"} <= set(roots) and not {"v1.1", "v1.2"} & set(roots)
    under_v1 = page.locator("#lineage li:has(> button[data-version='v1']) > ul button.node")
    assert {"v1.1", "v1.2"} <= set(under_v1.evaluate_all("ns => ns.map((n) => n.dataset.version)"))
    under_v11 = page.locator("#lineage li:has(> button[data-version='v1.1']) > ul button.node")
    assert under_v11.evaluate_all("ns => ns.map((n) => n.dataset.version)") == ["v1.2"]
    assert f"active: {GALLERY}" in page.text_content(f"#lineage button[data-version='{active_now}']")
    assert "gate failed" in page.text_content("#lineage button[data-version='v1.2']")
    # The gate report of v1.1: matrix table and heatmap, with no-route cells.
    page.click("#lineage button[data-version='v1.1']")
    page.wait_for_selector("#version-detail table.heatmap")
    assert "gate passed" in page.text_content("#version-detail h2")
    assert page.locator("#version-detail table.matrix-table:not(.heatmap) td.na").count() == 4
    heat = page.locator("#version-detail table.heatmap td.heat:not(.na)")
    assert heat.count() == 5
    colours = set(heat.evaluate_all("cs => cs.map((c) => c.style.backgroundColor)"))
    assert len(colours) == 5  # five different recalls, five different colours
    page.select_option("#version-detail select.metric", "i2t R@1")
    assert "0.750" in page.text_content("#version-detail table.heatmap")
    flips = page.text_content("#version-detail p.flips")
    assert "t2i 3.1%" in flips and "i2t 0.0%" in flips and "no bound set" in flips


def test_promote_and_roll_back_from_the_page(page: Any, stack: Stack) -> None:
    """Promote with the gate (a real one, which v1.1 passes: it has v1's weights), a
    promotion the gate refuses and then forced, and a rollback; each a real swap."""
    assert stack.api("GET", f"/v1/galleries/{GALLERY}")["active"] == "v1"
    gated = stack.api("POST", "/v1/jobs", json={"kind": "evaluate", "gallery": GALLERY,
                                                "params": {"version": "v1.1"}})
    page.goto(f"{stack.url}/#models")
    use_key(page)
    row = page.locator(f"#galleries tr[data-gallery={GALLERY}]")
    active = row.locator(".active-version")
    expect(active).to_have_text("v1")
    deadline = time.monotonic() + JOB_MS / 1000
    while (job := stack.api("GET", f"/v1/jobs/{gated['id']}"))["status"] != "succeeded":
        assert job["status"] in ("queued", "running", "applying"), job
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    assert job["gate"]["passed"] is True, job["gate"]
    page.click("#lineage button[data-version='v1.1']")
    page.fill("#version-detail input[name=reason]", "browser test")
    page.click("#version-detail button:text('Promote v1.1')")
    expect(active).to_have_text("v1.1")
    assert "now served by v1.1" in page.text_content("#models-status")

    page.click("#lineage button[data-version='v1.2']")
    page.click("#version-detail button:text('Promote v1.2')")  # its gate failed: refused
    page.wait_for_selector("#models-status.error")
    assert "gate" in page.text_content("#models-status").lower()
    page.wait_for_load_state("networkidle")  # the reload after the refused call
    # Forced past the gate with a reason: shown as forced, with who, wherever a gate shows.
    page.fill("#version-detail input[name=reason]", "drill")
    page.check("#version-detail input[name=force]")
    # A redraw (the reload after the refused call, or picking the version again) keeps
    # what was typed.
    page.click("#lineage button[data-version='v1.2']")
    expect(page.locator("#version-detail input[name=reason]")).to_have_value("drill")
    expect(page.locator("#version-detail input[name=force]")).to_be_checked()
    page.click("#version-detail button:text('Promote v1.2')")
    expect(active).to_have_text("v1.2")
    expect(page.locator("#lineage button[data-version='v1.2']")).to_contain_text("gate forced")
    page.click("#lineage button[data-version='v1.2']")
    expect(page.locator("#version-detail h2")).to_contain_text("gate forced")
    assert f"into {GALLERY} by ops" in page.text_content("#version-detail ul.forced")
    assert "FORCED (skipped: gate)" in row.text_content()

    page.click("#lineage button[data-version='v1']")
    page.click("#version-detail button:text('Roll back to v1')")
    expect(active).to_have_text("v1")
    # The real gateway swapped each time: it serves what the page shows.
    deadline = time.monotonic() + 30
    while stack.api("POST", f"/v1/galleries/{GALLERY}/search",
                    json={"text": "a red circle", "top_k": 1})["version"] != "v1":
        assert time.monotonic() < deadline, "the gateway did not swap back to v1"
        time.sleep(0.2)
    actions = [e["action"] for e in stack.api("GET", f"/v1/galleries/{GALLERY}")["history"]]
    assert actions[-3:] == ["promote", "promote", "rollback"]


# ---------------------------------------------------------------- jobs
@contextlib.contextmanager
def explained(stack: Stack) -> Iterator[None]:
    """A failure also shows the end of the stack's log (the worker's and gateway's lines)."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- the stack's log:\n{tail(stack.log)}") from exc


def started_job(page: Any, stack: Stack, kind: str) -> str:
    """The id of the job the form just started (from the status line)."""
    status = page.locator("#jobs-status")
    with explained(stack):
        expect(status).to_contain_text(f"Started {kind} job", timeout=30_000)
    found = re.search(rf"Started {kind} job (\S+)\.$", status.text_content())
    assert found, status.text_content()
    return found.group(1)


def job_row(page: Any, job_id: str) -> Any:
    return page.locator(f"tr[data-job='{job_id}']")


def wait_job(page: Any, stack: Stack, job_id: str, status: str = "succeeded") -> dict:
    """Until the page shows the job ``status`` (it polls); the job's record then."""
    with explained(stack):
        expect(job_row(page, job_id).locator("td:nth-child(3) .badge")).to_have_text(
            status, timeout=JOB_MS)
    job = stack.api("GET", f"/v1/jobs/{job_id}")
    assert job["status"] == status, job
    return job


def subset(params: dict[str, Any], expected: dict[str, Any]) -> bool:
    """``params`` holds ``expected`` (the server adds the defaults of the rest)."""
    return {k: params.get(k, "<absent>") for k in expected} == expected


def submit(form: Any, kind: str) -> None:
    form.locator(f"input[name=job-kind][value={kind}]").check()
    form.locator("button[type=submit]").click()


@pytest.fixture
def no_jobs_left(stack: Stack) -> Iterator[None]:
    """After the test, cancel what it left unfinished (a failed test must not keep the
    one worker busy for the tests after it)."""
    yield
    for job in stack.api("GET", "/v1/jobs"):
        if job["status"] in ("queued", "running"):
            httpx.delete(f"{stack.url}/v1/jobs/{job['id']}", headers=ADMIN, timeout=30)


def test_every_job_kind_runs_from_the_form(page: Any, stack: Stack, no_jobs_left: None) -> None:
    """Each kind the jobs form offers, as a person fills it in: the API takes what the
    form sends (202, not 422), the worker runs it to its end, and the page shows it."""
    page.goto(f"{stack.url}/#jobs")
    use_key(page)
    form = page.locator("#job-form")
    form.locator("input[name=gallery]").fill(GALLERY)

    # A continual phase: live progress on the page, then cancelled from it (below).
    form.locator("select[name=method]").select_option("seqft")
    form.locator("input[name=data]").fill(str(stack.world))
    form.locator("input[name=domain]").fill("polygons")
    form.locator("input[name=steps]").fill("100000")
    form.locator("input[name=batch_size]").fill("8")
    submit(form, "continual")
    long = started_job(page, stack, "continual")
    row = job_row(page, long)
    with explained(stack):
        expect(row.locator("progress[max='100000']")).to_be_visible(timeout=JOB_MS)
        expect(row.locator(".progress")).to_contain_text(
            re.compile(r"\d+/100000 · loss \d+\.\d{4}"), timeout=JOB_MS)
    assert int(row.locator("progress").get_attribute("value")) > 0

    # An XBT upgrade: first without its pairs, and the server's message is what the
    # person sees; then with a step count, which the API takes (it refused the form's
    # `params.steps` with 422: the step counts are XbtConfig fields, in params.config).
    # It waits behind the phase, and is cancelled from the page while queued.
    form.locator("input[value=xbt]").check()
    form.locator("input[name=new_version]").fill("v3")
    form.locator("input[name=corpus]").fill("synth:200")
    submit(form, "xbt")
    expect(page.locator("#jobs-status.error")).to_contain_text("params.pairs")
    form.locator("input[name=pairs]").fill(str(stack.world))
    form.locator("input[name=xbt_steps]").fill("2")
    submit(form, "xbt")
    queued = started_job(page, stack, "xbt")
    assert stack.api("GET", f"/v1/jobs/{queued}")["params"]["config"] == {"steps": 2}
    job_row(page, queued).locator("button:text('Cancel')").click()
    expect(page.locator("#jobs-status.ok")).to_contain_text(f"Asked job {queued} to stop")
    assert wait_job(page, stack, queued, "cancelled")["started_at"] is None  # never ran

    row.locator("button:text('Cancel')").click()
    expect(page.locator("#jobs-status.ok")).to_contain_text(f"Asked job {long} to stop")
    cancelled = wait_job(page, stack, long, "cancelled")
    assert subset(cancelled["params"], {"method": "seqft", "data": str(stack.world),
                                        "domain": "polygons", "language": None,
                                        "steps": 100000, "batch_size": 8})
    assert cancelled["version"] is None and 0 < cancelled["progress"]["step"] < 100000
    job_row(page, long).locator("button.link").click()
    expect(page.locator("#job-detail h3")).to_contain_text(long)
    assert "null" not in page.inner_text("#job-detail")  # absent fields are left out

    # The form offers every kind a person starts here (a migration starts from the
    # galleries table); each one is submitted below and run to its end.
    offered = form.locator("input[name=job-kind]").evaluate_all("rs => rs.map((r) => r.value)")
    assert offered == ["continual", "xbt", "adapter", "evaluate", "ingest"]

    # The XBT upgrade for real, with the step counts of both stages.
    form.locator("input[name=xbt_pretrain_steps]").fill("3")
    submit(form, "xbt")
    xbt = started_job(page, stack, "xbt")

    # An adapter route of v3 into the gallery's space, fitted on 16 of its items.
    form.locator("input[value=adapter]").check()
    expect(form.locator("input[name=new_version]")).to_have_value("v3")  # shared with xbt
    form.locator("select[name=adapter_method]").select_option("affine")
    form.locator("input[name=sample]").fill("16")
    submit(form, "adapter")
    adapter = started_job(page, stack, "adapter")

    # The gate of a registered version, again.
    form.locator("input[value=evaluate]").check()
    form.locator("input[name=eval_version]").fill("v1.2")
    submit(form, "evaluate")
    evaluate = started_job(page, stack, "evaluate")

    # Six more items, images and their captions.
    form.locator("input[value=ingest]").check()
    form.locator("input[name=manifest]").fill(str(stack.extra))
    form.locator("select[name=ingest_kinds]").select_option("image text")
    submit(form, "ingest")
    ingest = started_job(page, stack, "ingest")

    # What the API stored is what the form meant; the worker ran each to its end.
    done = wait_job(page, stack, xbt)
    assert done["params"]["config"] == {"pretrain_steps": 3, "steps": 2}
    assert done["params"]["new"]["version"] == "v3" and done["params"]["corpus"] == "synth:200"
    assert done["progress"]["stage"] == "gate" and done["progress"]["step"] == 2
    assert done["version"] and {"passed", "checks", "matrix"} <= set(done["gate"])
    assert done["promoted"] is False  # not asked to
    done = wait_job(page, stack, adapter)
    assert done["params"]["config"] == {"method": "affine"} and done["params"]["sample"] == 16
    assert done["params"]["new"]["version"] == "v3"
    assert stack.api("GET", f"/v1/models/{done['version']}")["space"] == "v3"
    done = wait_job(page, stack, evaluate)
    assert done["params"]["version"] == "v1.2"
    assert done["gate"]["candidate"] == "v1.2" and done["promoted"] is False
    done = wait_job(page, stack, ingest)
    assert done["params"]["manifest"] == str(stack.extra)
    assert done["params"]["kinds"] == ["image", "text"]
    assert stack.api("GET", f"/v1/galleries/{GALLERY}")["items"] == WORLD + 1 + 6
    texts = stack.api("POST", f"/v1/galleries/{GALLERY}/search",
                      json={"text": "a shape", "top_k": 6, "kind": "text"})["hits"]
    extra = [json.loads(line)["id"] for line in
             (stack.extra / "manifest.jsonl").read_text().splitlines()]
    assert sorted(h["id"] for h in texts) == sorted(extra)  # only they have texts
    # The page draws a real gate report of a finished job.
    job_row(page, evaluate).locator("button.link").click()
    expect(page.locator("#job-detail h4").first).to_have_text("Gate report")
    expect(page.locator("#job-detail h3 .badge")).to_have_text("succeeded")


# ---------------------------------------------------------------- migrations
MOVING = "moving"  # the migration test's own gallery: 'demo' stays as the others left it
MOVING_ITEMS = 6


@pytest.fixture(scope="module")
def moving(stack: Stack, micro_versions: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> str:
    """Gallery 'moving' (space v1, 6 API-ingested items, no validation set) served by
    'up': v1's weights relabelled as native to space v3, with a Procrustes route into v1
    (registered with v3 as its parent, so the lineage the models test checks keeps its
    roots)."""
    import shutil

    from service.state.registry import Registry
    from training.artifacts import load_artifact
    from training.data import open_dataset
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset

    root = tmp_path_factory.mktemp("up")
    relabelled = root / "v1-as-v3"
    shutil.copytree(micro_versions["v1"], relabelled)
    manifest = json.loads((relabelled / "manifest.json").read_text())
    (relabelled / "manifest.json").write_text(json.dumps({**manifest, "space": "v3",
                                                          "version_id": "v1-as-v3"}))
    sample = sample_from_dataset(load_artifact(micro_versions["v1"]), open_dataset(stack.world),
                                 k=16)
    up = fit_adapter(load_artifact(relabelled), sample, AdapterFitConfig(), "v1", root / "up",
                     old=load_artifact(micro_versions["v3"]), version_id="up")
    Registry(stack.registry_dir).register(up.path, by="fixture")
    items = []
    for n in range(MOVING_ITEMS):
        _, image = stack.image(n)
        items.append({"id": f"m{n}", "text": stack.caption(n),
                      "image_base64": b64(image.read_bytes())})
    stack.api("POST", "/v1/galleries", json={"name": MOVING, "space": "v1", "version": "v1"})
    stack.api("POST", f"/v1/galleries/{MOVING}/items", json={"items": items})
    # Forced: what it is promoted for is the migration, not a gate (tested elsewhere).
    stack.api("POST", "/v1/models/up/promote",
              json={"gallery": MOVING, "force": True, "reason": "migration fixture"})
    return MOVING


def test_a_migration_runs_from_the_page(page: Any, stack: Stack, moving: str) -> None:
    """Started from the galleries table, backfilled by the worker, its state and
    progress on the page, then the operator's switch (refused by the gate, then forced),
    rollback and retire, each a real call."""
    page.goto(f"{stack.url}/#models")
    use_key(page)
    row = page.locator(f"#galleries tr[data-gallery={moving}]")
    expect(row.locator(".space")).to_have_text("v1")
    expect(row.locator(".migration-cell")).to_contain_text("up is native to v3")
    row.locator("button[data-action=migrate]").click()
    expect(page.locator("#models-status.ok")).to_contain_text("Started migration job")
    panel = page.locator(f"#migrations .migration[data-migration={moving}]")
    expect(panel).to_be_visible()
    expect(row.locator(".migration-cell")).to_contain_text("v1 → v3 (up)")
    # While it backfills, the page polls by itself: the worker's progress shows up
    # without a click, to the last item.
    expect(panel.locator("[data-field=done]")).to_have_text(
        re.compile(rf"^[0-{MOVING_ITEMS}]/{MOVING_ITEMS}$"))
    expect(panel.locator("[data-field=done]")).to_have_text(
        f"{MOVING_ITEMS}/{MOVING_ITEMS}", timeout=JOB_MS)
    expect(panel.locator("progress")).to_have_attribute("value", str(MOVING_ITEMS))
    # The gallery has no validation set, so the gate cannot pass: no automatic switch.
    expect(panel.locator("[data-field=switch-refused]")).to_be_visible(timeout=JOB_MS)
    expect(panel.locator(".migration-gate")).to_contain_text("has no validation set")
    expect(panel.locator("h3 .badge")).to_have_text("backfilling")
    expect(panel.locator("[data-field=applied]")).to_have_text(str(MOVING_ITEMS))
    expect(panel.locator("[data-field=unreadable]")).to_have_text("0")
    view = stack.api("GET", f"/v1/galleries/{moving}/migration")
    assert view["job_status"] == "succeeded" and view["progress"]["done"] == MOVING_ITEMS
    assert stack.api("GET", f"/v1/jobs/{view['job']}")["kind"] == "migrate"

    panel.locator("button[data-action=switch]").click()
    expect(page.locator("#models-status.error")).to_contain_text(
        "the migration gate did not pass")
    panel.locator("input[name=reason]").fill("browser drill")
    panel.locator("input[name=force]").check()
    panel.locator("button[data-action=switch]").click()  # every item has its new vector
    expect(page.locator("#models-status.ok")).to_contain_text(
        f"{moving} now answers in space v3")
    expect(panel.locator("h3 .badge")).to_have_text("switched")
    expect(row.locator(".space")).to_have_text("v3")
    answer = stack.api("POST", f"/v1/galleries/{moving}/search",
                       json={"text": stack.caption(2), "top_k": MOVING_ITEMS})
    assert answer["space"] == "v3" and answer["route"] == "native"
    assert len(answer["hits"]) == MOVING_ITEMS  # the worker's vectors, all of them
    assert panel.locator("button[data-action=switch]").count() == 0

    panel.locator("input[name=reason]").fill("back to the route")
    panel.locator("button[data-action=rollback]").click()
    expect(page.locator("#models-status.ok")).to_contain_text("answers in space v1 again")
    expect(panel.locator("h3 .badge")).to_have_text("rolled_back")
    expect(row.locator(".space")).to_have_text("v1")
    expect(row).to_contain_text("migration-rollback up into space v1 by ops")
    expect(row).to_contain_text("— back to the route")
    assert panel.locator("button[data-action=rollback]").count() == 0
    assert stack.api("GET", f"/v1/galleries/{moving}/migration")["state"] == "rolled_back"
    panel.locator("button[data-action=retire]").click()
    expect(page.locator("#models-status.ok")).to_contain_text(
        f"the v3 side of {moving} was deleted")
    expect(page.locator("#migrations .migration")).to_have_count(0)
    expect(row.locator("button[data-action=migrate]")).to_be_visible()  # it can start again
    history = [e["action"] for e in stack.api("GET", f"/v1/galleries/{moving}")["history"]]
    assert history[-2:] == ["migrate", "migration-rollback"]


def test_a_transform_migration_shows_its_validation_curve(page: Any, stack: Stack,
                                                          moving: str) -> None:
    """Started from the row's options with a transform first (learned order, switch at the
    end, the world as validation set): the panel draws the validation curve with every
    point the API's progress has, the routed shares dashed, and where the backfill is.
    The transform fits on at least 8 pairs: the gallery gets 14 more items first, and the
    sample is 12 of its 20, so 8 are mapped, then re-embedded."""
    items = []
    for n in range(MOVING_ITEMS, MOVING_ITEMS + 14):
        _, image = stack.image(n)
        items.append({"id": f"t{n}", "text": stack.caption(n),
                      "image_base64": b64(image.read_bytes())})
    stack.api("POST", f"/v1/galleries/{moving}/items", json={"items": items})
    page.goto(f"{stack.url}/#models")
    use_key(page)
    row = page.locator(f"#galleries tr[data-gallery={moving}]")
    expect(row.locator("button[data-action=migrate]")).to_be_visible(timeout=JOB_MS)
    row.locator(".migrate-options summary").click()
    # Learned and progressive need the transform: not offered without it.
    expect(row.locator("select[name=order] option[value=learned]")).to_be_disabled()
    expect(row.locator("select[name=switch] option[value=progressive]")).to_be_disabled()
    row.locator("input[name=transform]").check()
    row.locator("select[name=order]").select_option("learned")
    row.locator("select[name=switch]").select_option("end")
    row.locator("input[name=sample]").fill("12")
    row.locator("input[name=validation]").fill(str(stack.world))
    row.locator("button[data-action=migrate]").click()
    expect(page.locator("#models-status.ok")).to_contain_text("Started migration job")
    panel = page.locator(f"#migrations .migration[data-migration={moving}]")
    expect(panel).to_be_visible()
    chart = panel.locator("svg.migration-curve")
    expect(chart).to_be_visible(timeout=JOB_MS)  # once the transform stage wrote the curve
    deadline = time.monotonic() + JOB_MS / 1000
    view = stack.api("GET", f"/v1/galleries/{moving}/migration")
    while view["job_status"] in ("queued", "running", "applying") and \
            time.monotonic() < deadline:
        time.sleep(0.5)
        view = stack.api("GET", f"/v1/galleries/{moving}/migration")
    assert view["job_status"] == "succeeded", view
    p = view["progress"]
    assert p["order"] == "learned" and p["switch"] == "end"
    assert p["transform"] and len(p["curve"]) >= 2, p
    assert view["result"]["transformed"] == 8, view  # the 20 items less the sample of 12
    assert p["transformed"] == 0, p  # none holds a transformed vector any more
    expect(chart).to_have_attribute("data-points", str(len(p["curve"])), timeout=JOB_MS)
    expect(chart).to_have_attribute("data-fraction", re.compile(r"^1(\.0+)?$"),
                                    timeout=JOB_MS)
    # A direction's line has the points where the share of the gain is defined (NEW
    # better than OLD on the validation set: in this micro world, 'up' is v1's weights,
    # so there may be none); the route's share is dashed where it has one.
    lines = 0
    for d in ("t2i", "i2t"):
        shared = [c for c in p["curve"] if (c[d].get("share") or {}).get("share") is not None]
        line = chart.locator(f"polyline.line-{d}")
        if shared:
            lines += 1
            expect(line).to_have_attribute("data-points", str(len(shared)))
        else:
            expect(line).to_have_count(0)
        routed = (p["routed"][d].get("share") or {}).get("share")
        expect(chart.locator(f"line.routed-{d}")).to_have_count(int(routed is not None))
    expect(chart).to_have_attribute("data-lines", str(lines))
    if not lines:
        expect(chart.locator("text.no-share").first).to_contain_text("no share of the gain")
    expect(chart.locator("g.marker.now")).to_have_count(1)
    expect(panel.locator("[data-field=re-embedded]")).to_have_text("100.0%")
    expect(panel.locator("[data-field=transformed]")).to_have_text(str(p["transformed"]))
    expect(panel.locator("[data-field=switch-plan]")).to_be_visible()
    if p["switch_at"] is not None:
        expect(chart).to_have_attribute("data-switch-at", re.compile(r"^[0-9.]+$"))
    # Leave the gallery as the story found it: back to its route, the new side dropped.
    if view["state"] == "switched":
        stack.api("POST", f"/v1/galleries/{moving}/migration/rollback", json={})
        stack.api("POST", f"/v1/galleries/{moving}/migration/retire")
    else:
        httpx.post(f"{stack.url}/v1/galleries/{moving}/migration/cancel", headers=ADMIN,
                   timeout=60).raise_for_status()


def test_the_curve_draws_each_direction_the_route_and_the_markers(browser: Any) -> None:
    """``migrationCurve`` of views.js, alone in a blank page, on a progress where NEW beats
    OLD (the micro world of the stack has no such gain): a line per direction with every
    point, a share below the floor clamped to it, the routes dashed, "now" and the
    progressive switch's marker, and the numbers beside it."""
    source = (REPO / "service" / "web" / "static" / "views.js").read_text()
    opened = open_tab(browser)
    page = opened.page
    try:
        page.set_content("<!doctype html><body><div id=out></div></body>")
        page.add_script_tag(content=source.replace("export function", "function")
                            .replace("export const", "const")
                            + "\nwindow.migrationCurve = migrationCurve;")
        grid = [0, 0.01, 0.05, *[round(0.05 * k, 2) for k in range(2, 21)]]
        point = lambda f: {"fraction": f,
                           "t2i": {"side": 0.5, "share": {"share": f - 0.5, "se": 0.05}},
                           "i2t": {"side": 0.5, "share": {"share": f, "se": 0.04}}}
        progress = {"fraction": 0.4, "order": "learned", "switch": "progressive",
                    "transformed": 900, "switch_at": 0.3, "switched_at_fraction": 0.35,
                    "switched_at": "2026-11-26T07:00:00Z",
                    "transform": {"method": "procrustes", "sample": 100},
                    "curve": [point(f) for f in grid],
                    "routed": {"t2i": {"R@1": 0.4, "share": {"share": 0.2, "se": 0.05}},
                               "i2t": {"R@1": 0.4, "share": {"share": 0.25, "se": 0.05}}},
                    "share_estimate": {"fraction": 0.4, **point(0.4)}}
        page.evaluate("(p) => document.getElementById('out').replaceChildren("
                      "window.migrationCurve(p, {gallery: 'g'}))", progress)
        chart = page.locator("svg.migration-curve#migration-curve-g")
        expect(chart).to_have_attribute("data-points", str(len(grid)))
        expect(chart).to_have_attribute("data-lines", "2")
        expect(chart).to_have_attribute("data-fraction", "0.4")
        expect(chart).to_have_attribute("data-switched-at", "0.35")
        for d in ("t2i", "i2t"):
            expect(chart.locator(f"polyline.line-{d}")).to_have_attribute(
                "data-points", str(len(grid)))
            expect(chart.locator(f"line.routed-{d}")).to_have_count(1)
        ys = page.evaluate("""() => [...document.querySelectorAll('polyline.line-t2i')][0]
            .getAttribute('points').split(' ').map((p) => Number(p.split(',')[1]))""")
        assert ys[0] == ys[1] == max(ys)  # -0.5 and -0.49: both at the floor
        expect(chart.locator("g.marker.now")).to_have_attribute("data-fraction", "0.4")
        expect(chart.locator("g.marker.switched")).to_have_attribute("data-fraction", "0.35")
        expect(chart.locator("g.marker.planned")).to_have_count(0)
        expect(page.locator("[data-field=switch-plan]")).to_have_text(
            "switched at 35.0% (2026-11-26T07:00:00Z)")
        expect(page.locator("[data-field='share now']")).to_have_text(
            "t2i -10.0% ± 5.0%, i2t 40.0% ± 4.0%")
        expect(page.locator("[data-field=transformed]")).to_have_text("900")
        assert opened.errors == []
    finally:
        page.context.close()


# ---------------------------------------------------------------- upgrade plans
PLANNED = "planned"  # the plan tests' own gallery (space v1, served by v1)
PLANNED_ITEMS = 16


class ApiCount:
    """The gallery's size as the gateway reports it: all ``basis_now`` reads of a gallery
    store (the test cannot open the embedded Qdrant that the gateway holds)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def count(self, gallery: str) -> int:
        return self.stack.api("GET", f"/v1/galleries/{gallery}")["items"]


@dataclass(frozen=True)
class Planned:
    params: dict[str, Any]  # as the API stores a plan job's
    plan: dict[str, Any]  # training.upgrades.plan.run.run_plan's record
    basis: dict[str, Any]  # service.jobkinds.plan.basis_now of the gallery

    def record(self, stack: Stack, *, finished: bool) -> str:
        """A plan job in the gateway's job store, as a worker leaves it: running at the
        stage of fitting the adapters, or succeeded with the plan (no worker runs it: it
        was never queued)."""
        from service.state.jobs.store import JobStore

        jobs = JobStore(stack.registry_dir)
        job = jobs.create("plan", PLANNED, self.params, by="ops")
        jobs.start(job.id, "plan-fixture:1")
        jobs.beat(job.id, {"stage": "fit the adapters"})
        if finished:
            self.finish(stack, job.id)
        return job.id

    def finish(self, stack: Stack, job_id: str) -> None:
        from service.state.jobs.store import JobStore

        JobStore(stack.registry_dir).finish(job_id, "succeeded", progress={"stage": "done"},
                                            result={"plan": self.plan, "basis": self.basis})


@pytest.fixture(scope="module")
def planned(stack: Stack, micro_versions: dict[str, Path],
            tmp_path_factory: pytest.TempPathFactory) -> Planned:
    """Gallery 'planned' (16 of the world's items, served by the micro v1, the world as its
    validation set), a candidate trained on the world for real (a micro model with a wider
    text tower, registered as 'candidate': it beats the random v1 in both directions, so
    every measured option has a share of the gain), and its plan computed for real by
    ``run_plan`` on the gallery's sample, as a plan job's worker would."""
    from service.jobkinds.plan import PlanParams, basis_now
    from service.state.registry import Registry
    from training.artifacts import load_artifact
    from training.contrastive import train_contrastive
    from training.data import open_dataset
    from training.trainer import TrainConfig
    from training.upgrades.adapter.fit import sample_from_dataset
    from training.upgrades.plan.decide import Constraints
    from training.upgrades.plan.run import run_plan

    stack.api("POST", "/v1/galleries", json={"name": PLANNED, "space": "v1", "version": "v1",
                                             "validation": str(stack.world)})
    items = []
    for n in range(PLANNED_ITEMS):
        _, image = stack.image(n)
        items.append({"id": f"p{n}", "text": stack.caption(n),
                      "image_base64": b64(image.read_bytes())})
    stack.api("POST", f"/v1/galleries/{PLANNED}/items", json={"items": items})
    world = open_dataset(stack.world)
    candidate = train_contrastive(micro_model(96), world,
                                  TrainConfig(steps=200, batch_size=20, lr=3e-3, warmup=0.0),
                                  tmp_path_factory.mktemp("candidate") / "candidate",
                                  version_id="candidate", device="cpu", show_progress=False)
    registry = Registry(stack.registry_dir)
    registry.register(candidate.path, by="fixture")
    old = load_artifact(micro_versions["v1"])
    sample = sample_from_dataset(old, world, k=PLANNED_ITEMS)
    plan = run_plan(candidate, old, "v1", sample, world, PLANNED_ITEMS, Constraints(),
                    device="cpu")
    assert plan["recommendation"]["option"] and plan["curve"], plan["recommendation"]
    assert [o for o in plan["options"] if o.get("share")], "no option has a share of the gain"
    params = PlanParams.model_validate({"new": {"version": "candidate"},
                                        "sample": PLANNED_ITEMS}).model_dump(by_alias=True)
    basis = basis_now(registry, ApiCount(stack), PLANNED, None)  # type: ignore[arg-type]
    assert basis["items"] == PLANNED_ITEMS and basis["incumbent"] == "v1"
    return Planned(json.loads(json.dumps(params)), plan, basis)


def open_plans(page: Any, stack: Stack) -> None:
    page.goto(f"{stack.url}/#models")
    use_key(page)
    picker = page.locator("#plan-form select[name=gallery]")
    expect(picker.locator(f"option[value={PLANNED}]")).to_have_count(1)
    picker.select_option(PLANNED)


def marker_x(chart: Any, option: str, direction: str) -> float:
    """The centre (x, in the chart's own units) of an option's marker."""
    return chart.locator(f"g.option-marker[data-option='{option}']"
                         f"[data-direction={direction}] .dot").evaluate(
        "(dot) => { const b = dot.getBBox(); return b.x + b.width / 2; }")


def test_a_plan_is_polled_then_drawn_with_its_options(page: Any, stack: Stack,
                                                      planned: Planned) -> None:
    """A running plan shows its stage; once it is done the page, polling by itself, draws
    the plan: a marker per measured option and direction (none for an estimated one),
    the recommended option's ringed, error bars, the migration's curve per direction, on
    a log scale of compute; and the table, the recommendation and its why."""
    plan_id = planned.record(stack, finished=False)
    open_plans(page, stack)
    row = page.locator(f"#plans tr[data-plan={plan_id}]")
    expect(row.locator(".plan-status .badge").first).to_have_text("running")
    expect(row).to_contain_text("fit the adapters")
    panel = page.locator(f"#plan-detail .plan[data-plan={plan_id}]")
    expect(panel.locator("svg.plan-chart")).to_have_count(0)

    planned.finish(stack, plan_id)
    chart = panel.locator("svg.plan-chart")
    expect(chart).to_be_visible(timeout=JOB_MS)  # no click: the page polled
    expect(row.locator(".plan-status .badge").first).to_have_text("succeeded")
    plan = planned.plan
    shared = {o["name"]: [d for d in ("t2i", "i2t") if (o.get("share") or {}).get(d)]
              for o in plan["options"] if o["measured"]}
    expect(chart).to_have_attribute("data-markers", str(sum(map(len, shared.values()))))
    for o in plan["options"]:
        markers = chart.locator(f"g.option-marker[data-option='{o['name']}']")
        expect(markers).to_have_count(len(shared.get(o["name"], [])))  # estimated: none
        for d in shared.get(o["name"], []):
            share = o["share"][d]
            marker = chart.locator(f"g.option-marker[data-option='{o['name']}']"
                                   f"[data-direction={d}]")
            assert float(marker.get_attribute("data-share")) == share["share"]
            expect(marker.locator("line.error-bar")).to_have_count(int(bool(share["se"])))
    # t2i and i2t are told apart by their shape.
    expect(chart.locator("g.marker-t2i circle.dot").first).to_be_attached()
    expect(chart.locator("g.marker-i2t rect.dot").first).to_be_attached()
    best = plan["recommendation"]["option"]
    recommended = chart.locator("g.option-marker[data-recommended]")
    expect(recommended).to_have_count(len(shared[best]))
    assert set(recommended.evaluate_all("gs => gs.map((g) => g.dataset.option)")) == {best}
    expect(recommended.locator("circle.ring")).to_have_count(len(shared[best]))
    for d in ("t2i", "i2t"):
        points = [p for p in plan["curve"]["points"] if (p.get(d) or {}).get("share") is not None]
        line = chart.locator(f"polyline.plan-curve[data-direction={d}]")
        expect(line).to_have_attribute("data-points", str(len(points)))
        expect(line).to_have_attribute("data-option", plan["curve"]["option"])
    # Compute on a log scale: equal ratios of compute, equal distances.
    computes = sorted({(o["compute"]["fraction"], o["name"]) for o in plan["options"]
                       if "t2i" in shared.get(o["name"], [])})
    low, mid, high = computes[0], computes[len(computes) // 2], computes[-1]
    assert low[0] < mid[0] < high[0], computes
    xs = [marker_x(chart, name, "t2i") for _, name in (low, mid, high)]
    logs = [math.log10(c) for c, _ in (low, mid, high)]
    assert (xs[1] - xs[0]) / (xs[2] - xs[0]) == pytest.approx(
        (logs[1] - logs[0]) / (logs[2] - logs[0]), abs=0.01)
    # The table, the recommendation and its why.
    table = panel.locator("table.plan-options")
    expect(table.locator("tbody tr")).to_have_count(len(plan["options"]))
    expect(table.locator("tr.recommended")).to_have_attribute("data-option", best)
    for name, directions in shared.items():
        o = next(o for o in plan["options"] if o["name"] == name)
        for d in directions:
            s = o["share"][d]
            text = f"{100 * s['share']:.1f}%" + (f" ± {100 * s['se']:.1f}%" if s["se"] is not None
                                                 else "")
            expect(table.locator(f"tr[data-option='{name}'] [data-field=share-{d}]")).to_have_text(
                text)
        if o["why_not"]:
            expect(table.locator(f"tr[data-option='{name}']")).to_contain_text(o["why_not"])
    expect(panel.locator(".plan-recommendation code")).to_have_text(best)
    expect(panel.locator(".plan-recommendation [data-field=why]")).to_have_text(
        plan["recommendation"]["why"])
    applicable = [o["name"] for o in plan["options"] if o["applicable"]]
    expect(table.locator("button[data-action=apply]")).to_have_count(len(applicable))
    expect(panel.locator("[data-field=stale]")).to_have_count(0)  # it describes the gallery
    expect(panel.locator("input[name=force]")).to_have_count(0)


def test_a_plan_is_started_and_applied_from_the_page(page: Any, stack: Stack, planned: Planned,
                                                     no_jobs_left: None) -> None:
    """The form starts a plan job (the server's message when it refuses one); a finished
    plan's options are applied: a migration before the candidate serves is refused with
    why, a route starts its adapter job, and once the gallery moved (the plan is stale)
    only a forced apply with a reason is taken."""
    plan_id = planned.record(stack, finished=True)
    open_plans(page, stack)
    form = page.locator("#plan-form")
    form.locator("input[name=version]").fill("no-such-version")
    form.locator("button[type=submit]").click()
    expect(page.locator("#plan-status.error")).to_contain_text("no-such-version")
    form.locator("input[name=version]").fill("candidate")
    form.locator("input[name=sample]").fill("8")
    form.locator("select[name=objective]").select_option("mean")
    form.locator("input[name=max_negative_flip]").fill("0.2")
    form.locator("button[type=submit]").click()
    expect(page.locator("#plan-status.ok")).to_contain_text("Started plan job")
    started = re.search(r"Started plan job (\S+) of", page.text_content("#plan-status"))
    assert started, page.text_content("#plan-status")
    job = stack.api("GET", f"/v1/jobs/{started.group(1)}")
    assert job["kind"] == "plan" and job["gallery"] == PLANNED
    assert subset(job["params"], {"sample": 8, "objective": "mean"})
    assert job["params"]["constraints"]["max_negative_flip"] == 0.2
    expect(page.locator(f"#plans tr[data-plan={job['id']}]")).to_be_visible()
    stack.api("DELETE", f"/v1/jobs/{job['id']}")  # the worker need not run it

    page.locator(f"#plans tr[data-plan={plan_id}] button.link").click()
    panel = page.locator(f"#plan-detail .plan[data-plan={plan_id}]")
    expect(panel.locator("svg.plan-chart")).to_be_visible()
    panel.locator("button[data-action=apply][data-option='migrate']").click()
    expect(page.locator("#plan-status.error")).to_contain_text(
        "a migration re-embeds with the version that serves")
    panel.locator("button[data-action=apply][data-option='route:procrustes']").click()
    expect(page.locator("#plan-status.ok")).to_contain_text(
        "Applied route:procrustes: started adapter job")
    expect(panel.locator(".plan-applied li[data-option='route:procrustes']")).to_be_visible()
    applied = stack.api("GET", f"/v1/galleries/{PLANNED}/plans/{plan_id}")["applied"]
    adapter = stack.api("GET", f"/v1/jobs/{applied[0]['job']}")
    option = next(o for o in planned.plan["options"] if o["name"] == "route:procrustes")
    assert adapter["kind"] == "adapter" and adapter["auto_promote"] is True
    assert adapter["params"]["config"] == option["apply"]["config"]

    # The gallery grows by a quarter: the plan no longer describes it.
    more = []
    for n in range(PLANNED_ITEMS, PLANNED_ITEMS + 4):
        _, image = stack.image(n)
        more.append({"id": f"p{n}", "text": stack.caption(n),
                     "image_base64": b64(image.read_bytes())})
    stack.api("POST", f"/v1/galleries/{PLANNED}/items", json={"items": more})
    open_plans(page, stack)
    page.locator(f"#plans tr[data-plan={plan_id}] button.link").click()
    expect(panel.locator("[data-field=stale]")).to_contain_text(
        f"the gallery holds {PLANNED_ITEMS + 4} items, {PLANNED_ITEMS} when planned")
    expect(page.locator(f"#plans tr[data-plan={plan_id}] .plan-status")).to_contain_text("stale")
    affine = panel.locator("button[data-action=apply][data-option='route:affine']")
    affine.click()
    expect(page.locator("#plan-status.error")).to_contain_text("is stale")
    panel.locator("input[name=force]").check()
    affine.click()
    expect(page.locator("#plan-status.error")).to_contain_text("needs a reason")
    panel.locator("input[name=reason]").fill("browser drill")
    affine.click()
    expect(page.locator("#plan-status.ok")).to_contain_text(
        "Applied route:affine (forced): started adapter job")
    forced = panel.locator(".plan-applied li[data-option='route:affine']")
    expect(forced).to_contain_text("browser drill")
    expect(forced.locator(".badge")).to_have_text("forced")
    applied = stack.api("GET", f"/v1/galleries/{PLANNED}/plans/{plan_id}")["applied"]
    assert [(a["option"], a["forced"], a["reason"]) for a in applied] == [
        ("route:procrustes", False, None), ("route:affine", True, "browser drill")]


def test_a_plans_apply_buttons_are_in_view_on_a_laptop_screen(page: Any, stack: Stack,
                                                              planned: Planned) -> None:
    """On the tab's 1366-px-wide window, the table of a finished plan fits its panel:
    every Apply button lies inside the table's box and the viewport, seen without
    scrolling the table or the page sideways (a click would scroll to it, so this reads
    where the buttons are drawn before any)."""
    plan_id = planned.record(stack, finished=True)
    open_plans(page, stack)
    page.locator(f"#plans tr[data-plan={plan_id}] button.link").click()
    panel = page.locator(f"#plan-detail .plan[data-plan={plan_id}]")
    table = panel.locator("table.plan-options")
    expect(table).to_be_visible()
    buttons = table.locator("button[data-action=apply]")
    expect(buttons).to_have_count(sum(1 for o in planned.plan["options"] if o["applicable"]))
    assert page.viewport_size["width"] == 1366
    scroll = panel.locator(".table-scroll")
    sizes = scroll.evaluate("(box) => [box.scrollWidth, box.clientWidth]")
    assert sizes[0] <= sizes[1], f"the table is {sizes[0]} px wide in a {sizes[1]} px box"
    page_width = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
    assert page_width[0] <= page_width[1], page_width
    box = scroll.bounding_box()
    right = min(box["x"] + box["width"], 1366)
    for n in range(buttons.count()):
        b = buttons.nth(n).bounding_box()
        assert box["x"] <= b["x"] and b["x"] + b["width"] <= right, (
            buttons.nth(n).get_attribute("data-option"), b, box)
