"""The web page in a real browser: headless Chromium (Debian's ``chromium`` package) driven
by Playwright against a real gateway (uvicorn on a free port, tiny random-init models).

It checks what a person would: a text search and an image upload show result
thumbnails that actually loaded, the models page shows the lineage, the active version
and a gate report's heatmap, promote / roll back work from the page, the jobs form
sends the jobs API's contract and shows live progress (the jobs API is mocked in the
browser here, so this test does not depend on a worker), and a gallery's migration
shows its state and progress with the operator calls that apply (the test plays the
worker's part through the job store; the gateway and its API are real).

Set NOBACKFILL_WEB_SCREENSHOTS=dir to keep a full-page screenshot of each test.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import torch
from conftest import ADMIN, ADMIN_KEY, MICRO_CONFIG, MICRO_PREPROCESS
from PIL import Image
from test_service_api import b64, png

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported by require_browser() as a failure, not a collection error
    expect = sync_playwright = None  # type: ignore[assignment]

from service.stack.launch import free_port
from training.data import generate_items, render
from training.encoders import ModelSpec

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ITEMS = generate_items(16, seed=21, languages=("en",))
ODD_ID = "odd/id 100% ü"  # a slash, a percent sign and non-ASCII, all through real URLs
TIMEOUT_MS = 10_000


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
class Live:
    url: str
    first_png: Path  # the rendered image of ITEMS[0], as ingested
    settings: Any  # the gateway's Settings (its registry, job store and worker records)


def child_version(root: Path, version_id: str, parent: str, seed: int,
                  gate: dict[str, Any]) -> Path:
    """A micro artifact trained "from" ``parent`` (random weights; only the lineage matters)."""
    from training.artifacts import WEIGHTS, model_state, write_artifact
    from training.encoders import create_model

    spec = ModelSpec(config=json.loads(json.dumps(MICRO_CONFIG)),
                     preprocess=dict(MICRO_PREPROCESS))
    torch.manual_seed(seed)
    manifest = {"version_id": version_id, "space": "v1", "model_spec": spec.to_dict(),
                "embed_dim": 32, "kind": "continual", "parent": parent, "gate": gate}
    return write_artifact(root / version_id, manifest,
                          {WEIGHTS: model_state(create_model(spec))}).path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, micro_versions: dict[str, Path]) -> Iterator[Live]:
    """A gateway on a free port: v1 -> v1.1 -> v1.2 and v3 registered, gallery 'shapes'
    (space v1, served by v1) holding 16 synthetic image+caption items and one odd id."""
    import uvicorn

    from service.api.app import create_app
    from service.state.config import Settings
    from service.state.registry import Registry

    root = tmp_path_factory.mktemp("web")
    settings = Settings(data_dir=root / "data", qdrant_path=":memory:",
                        admin_api_keys={"ops": ADMIN_KEY}, registry_poll_interval_s=0.2,
                        access_log=False)
    registry = Registry(settings.registry_dir)
    for vid in ("v1", "v3"):
        registry.register(micro_versions[vid], by="fixture")
    # The gate reports stand in for gates the service ran (a manifest's is never trusted).
    registry.register(child_version(root / "art", "v1.1", "v1", 11, GATE), by="fixture",
                      gate=GATE)
    registry.register(child_version(root / "art", "v1.2", "v1.1", 12, {"passed": False}),
                      by="fixture", gate={"passed": False})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="web-test-gateway", daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        url = f"http://127.0.0.1:{port}"
        first_png = root / "query.png"
        first_png.write_bytes(png(render(ITEMS[0], 64)))
        _fill_gallery(url)
        yield Live(url, first_png, settings)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _wait_started(server: Any, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the gateway thread died while starting (see the log)"
        assert time.monotonic() < deadline, "the gateway did not start in 30 s"
        time.sleep(0.05)


def _fill_gallery(url: str) -> None:
    items = [{"id": it.id, "text": it.captions["en"][0],
              "image_base64": b64(png(render(it, 64))),
              "payload": {"domain": it.domain, "shape": it.attributes.get("shape", "")}}
             for it in ITEMS]
    items.append({"id": ODD_ID, "image_base64": b64(png(Image.new("RGB", (50, 30), "gold")))})
    with httpx.Client(base_url=url, headers=ADMIN, timeout=30) as http:
        r = http.post("/v1/galleries", json={"name": "shapes", "space": "v1", "version": "v1"})
        assert r.status_code == 201, r.text
        r = http.post("/v1/galleries/shapes/items", json={"items": items})
        assert r.status_code == 200, r.text
        # Percent-encoded once on the wire, decoded once by a real server.
        r = http.get(f"/v1/galleries/shapes/items/{quote(ODD_ID, safe='')}/thumbnail")
        assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.text


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


@pytest.fixture
def page(browser: Any, live: Live, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh tab (own sessionStorage) on a laptop-sized window; fails on any JS error."""
    context = browser.new_context(viewport={"width": 1366, "height": 850})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    tab.on("console", lambda msg: errors.append(msg.text)
           if msg.type == "error" and "Content Security Policy" in msg.text else None)
    yield tab
    shots = os.environ.get("NOBACKFILL_WEB_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(Path(shots) / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert errors == []


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


# ---------------------------------------------------------------- search
def test_text_search_shows_loaded_thumbnails(page: Any, live: Live) -> None:
    page.goto(f"{live.url}/#search")
    page.fill("#gallery", "shapes")
    page.fill("#query-text", ITEMS[3].captions["en"][0])
    page.fill("#top-k", "8")
    page.click("#search-form button[type=submit]")
    page.wait_for_selector("#results figure.card")
    assert page.locator("#results figure.card").count() == 8
    wait_thumbnails_loaded(page, 8)
    meta = {f: page.text_content(f"#search-meta [data-field={f}]")
            for f in ("gallery", "version", "route", "space", "kind")}
    assert meta == {"gallery": "shapes", "version": "v1", "route": "native", "space": "v1",
                    "kind": "image"}
    scores = [float(s.split()[-1]) for s in page.locator("#results .score").all_text_contents()]
    assert scores == sorted(scores, reverse=True)


def test_image_upload_shows_results(page: Any, live: Live) -> None:
    page.goto(f"{live.url}/")
    page.fill("#gallery", "shapes")
    page.fill("#top-k", "17")
    page.set_input_files("#query-image", str(live.first_png))  # searches on change
    page.wait_for_selector(f"#results figure.card[data-id='{ITEMS[0].id}']")
    first = page.locator("#results figure.card").first
    assert first.get_attribute("data-id") == ITEMS[0].id  # its own image, cosine 1
    assert float(first.locator(".score").text_content().split()[-1]) == pytest.approx(1, abs=1e-3)
    wait_thumbnails_loaded(page, 17)  # every item, the odd id's picture included
    assert page.is_visible("#query-preview")
    # With a key set, thumbnails are fetched with the header and shown from blob: URLs.
    use_key(page)
    page.click("#search-form button[type=submit]")
    page.wait_for_function("""() => [...document.querySelectorAll('#results img.thumb')]
        .some((i) => i.src.startsWith('blob:'))""")
    wait_thumbnails_loaded(page, 17)


def test_search_errors_show_the_server_message(page: Any, live: Live) -> None:
    page.goto(f"{live.url}/")
    page.fill("#gallery", "no-such-gallery")
    page.fill("#query-text", "a red circle")
    page.click("#search-form button[type=submit]")
    page.wait_for_selector("#search-status.error")
    assert "no-such-gallery" in page.text_content("#search-status")


# ---------------------------------------------------------------- models
def test_models_page_shows_lineage_active_version_and_gate(page: Any, live: Live) -> None:
    page.goto(f"{live.url}/#models")
    page.wait_for_selector("#models-status.error")  # admin view: asks for the key first
    use_key(page)
    active = page.wait_for_selector("#galleries tr[data-gallery=shapes] .active-version")
    assert active.text_content() == "v1"
    # Lineage: v1.1 under v1, v1.2 under v1.1, v3 a root of its own.
    assert page.locator("#lineage > ul > li > button.node").evaluate_all(
        "nodes => nodes.map((n) => n.dataset.version).sort()") == ["v1", "v3"]
    under_v1 = page.locator("#lineage li:has(> button[data-version='v1']) > ul button.node")
    assert sorted(under_v1.evaluate_all("ns => ns.map((n) => n.dataset.version)")) == \
        ["v1.1", "v1.2"]
    assert "active: shapes" in page.text_content("#lineage button[data-version='v1']")
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


def test_promote_and_roll_back_from_the_page(page: Any, live: Live) -> None:
    page.goto(f"{live.url}/#models")
    use_key(page)
    page.click("#lineage button[data-version='v1.2']")
    page.click("#version-detail button:text('Promote v1.2')")  # its gate failed: refused
    page.wait_for_selector("#models-status.error")
    assert "gate" in page.text_content("#models-status").lower()
    # Forced past the gate with a reason: shown as forced, with who, wherever a gate shows.
    page.fill("#version-detail input[name=reason]", "drill")
    page.check("#version-detail input[name=force]")
    # A redraw (the reload after the refused call, or picking the version again) keeps
    # what was typed.
    page.click("#lineage button[data-version='v1.2']")
    expect(page.locator("#version-detail input[name=reason]")).to_have_value("drill")
    expect(page.locator("#version-detail input[name=force]")).to_be_checked()
    page.click("#version-detail button:text('Promote v1.2')")
    active = page.locator("#galleries tr[data-gallery=shapes] .active-version")
    expect(active).to_have_text("v1.2")
    expect(page.locator("#lineage button[data-version='v1.2']")).to_contain_text("gate forced")
    page.click("#lineage button[data-version='v1.2']")
    expect(page.locator("#version-detail h2")).to_contain_text("gate forced")
    assert "into shapes by ops" in page.text_content("#version-detail ul.forced")
    assert "FORCED (skipped: gate)" in page.text_content("#galleries tr[data-gallery=shapes]")
    page.click("#lineage button[data-version='v1.1']")
    page.fill("#version-detail input[name=reason]", "browser test")
    page.click("#version-detail button:text('Promote v1.1')")
    expect(active).to_have_text("v1.1")
    assert "now served by v1.1" in page.text_content("#models-status")
    page.click("#lineage button[data-version='v1']")
    page.click("#version-detail button:text('Roll back to v1')")
    expect(active).to_have_text("v1")


# ---------------------------------------------------------------- jobs
class FakeJobs:
    """The jobs API's contract, played in the browser: records what the page sends and
    moves the job along on every poll."""

    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.job: dict[str, Any] | None = None
        self.polls = 0

    def collection(self, route: Any, request: Any) -> None:
        assert request.headers.get("x-api-key") == ADMIN_KEY
        if request.method == "POST":
            body = request.post_data_json
            self.posted.append(body)
            if body["kind"] == "xbt":
                route.fulfill(status=422, json={"error": {
                    "code": "invalid_request", "message": "params.pairs: field required"}})
                return
            self.job = {"id": "job-1234abcd", "kind": body["kind"], "gallery": body["gallery"],
                        "status": "queued", "progress": {}, "created_at": "2030-01-01T00:00:00Z",
                        "started_at": None, "ended_at": None, "version": None, "gate": None,
                        "error": None, "auto_promote": body["auto_promote"]}
            route.fulfill(status=202, json=self.job)
            return
        self.polls += 1
        if self.job and self.job["status"] == "queued":
            self.job.update(status="running", started_at="2030-01-01T00:00:01Z",
                            progress={"stage": "train", "step": 5, "total": 20, "loss": 1.25,
                                      "eta_s": 30})
        route.fulfill(json=[self.job] if self.job else [])

    def one(self, route: Any, request: Any) -> None:
        assert request.method == "DELETE" and self.job is not None
        self.cancelled.append(request.url.rsplit("/", 1)[-1])
        self.job.update(status="cancelled", ended_at="2030-01-01T00:00:09Z")
        route.fulfill(status=202, json=self.job)


def test_jobs_form_sends_the_contract_and_shows_progress(page: Any, live: Live) -> None:
    jobs = FakeJobs()
    page.route("**/v1/jobs", jobs.collection)
    page.route("**/v1/jobs/*", jobs.one)
    page.goto(f"{live.url}/#jobs")
    use_key(page)
    form = page.locator("#job-form")
    form.locator("input[name=gallery]").fill("shapes")
    form.locator("select[name=method]").select_option("dns")
    form.locator("input[name=data]").fill("/data/new-domain")
    form.locator("input[name=steps]").fill("20")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("#jobs-status.ok")
    assert jobs.posted[0] == {"kind": "continual", "gallery": "shapes", "auto_promote": False,
                              "params": {"method": "dns", "data": "/data/new-domain",
                                         "domain": None, "language": None, "steps": 20}}
    bar = page.wait_for_selector("tr[data-job='job-1234abcd'] progress[value='5']")
    assert bar.get_attribute("max") == "20"
    assert "train · 5/20 · loss 1.2500" in page.text_content("tr[data-job='job-1234abcd']")
    page.click("tr[data-job='job-1234abcd'] button:text('Cancel')")
    expect(page.locator("tr[data-job='job-1234abcd'] .badge")).to_have_text("cancelled")
    assert jobs.cancelled == ["job-1234abcd"]
    assert "null" not in page.inner_text("#job-detail")  # absent fields are left out
    # An XBT upgrade; the server's error message is what the person sees.
    form.locator("input[value=xbt]").check()
    form.locator("input[name=new_version]").fill("v3")
    form.locator("input[name=auto_promote]").check()
    form.locator("button[type=submit]").click()
    expect(page.locator("#jobs-status")).to_have_text("params.pairs: field required")
    assert jobs.posted[1] == {"kind": "xbt", "gallery": "shapes", "auto_promote": True,
                              "params": {"new": {"version": "v3"}, "corpus": "synth:20000"}}
    assert jobs.polls >= 2


# ---------------------------------------------------------------- migrations
MOVING = "moving"  # the migration test's own gallery: 'shapes' stays as the others left it


@pytest.fixture(scope="module")
def moving(live: Live, micro_versions: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> str:
    """Gallery 'moving' (space v1, 6 API-ingested items) served by 'up': v1's weights
    relabelled as native to space v3, with a Procrustes route into v1 (registered with
    v3 as its parent, so the lineage the models test checks keeps its roots)."""
    import shutil

    from service.state.registry import Registry
    from training.adapters import AdapterFitConfig
    from training.adapters.fit import fit_adapter, sample_from_dataset
    from training.artifacts import load_artifact
    from training.data import open_dataset, write_dataset

    root = tmp_path_factory.mktemp("up")
    write_dataset(root / "world", 16, seed=5, languages=("en",), image_size=32)
    relabelled = root / "v1-as-v3"
    shutil.copytree(micro_versions["v1"], relabelled)
    manifest = json.loads((relabelled / "manifest.json").read_text())
    (relabelled / "manifest.json").write_text(json.dumps({**manifest, "space": "v3",
                                                          "version_id": "v1-as-v3"}))
    sample = sample_from_dataset(load_artifact(micro_versions["v1"]),
                                 open_dataset(root / "world"), k=16)
    up = fit_adapter(load_artifact(relabelled), sample, AdapterFitConfig(), "v1", root / "up",
                     old=load_artifact(micro_versions["v3"]), version_id="up")
    Registry(live.settings.registry_dir).register(up.path, by="fixture",
                                                  gate={"passed": True, "note": "fixture"})
    items = [{"id": f"m{n}", "text": it.captions["en"][0], "image_base64": b64(png(render(it, 64)))}
             for n, it in enumerate(ITEMS[:6])]
    with httpx.Client(base_url=live.url, headers=ADMIN, timeout=30) as http:
        r = http.post("/v1/galleries", json={"name": MOVING, "space": "v1", "version": "v1"})
        assert r.status_code == 201, r.text
        r = http.post(f"/v1/galleries/{MOVING}/items", json={"items": items})
        assert r.status_code == 200, r.text
        r = http.post("/v1/models/up/promote", json={"gallery": MOVING})
        assert r.status_code == 200, r.text
    return MOVING


def migration_view(live: Live) -> dict[str, Any]:
    with httpx.Client(base_url=live.url, headers=ADMIN, timeout=30) as http:
        r = http.get(f"/v1/galleries/{MOVING}/migration")
        assert r.status_code == 200, r.text
        return r.json()


def test_a_migration_shows_its_state_progress_and_operator_calls(page: Any, live: Live,
                                                                 moving: str) -> None:
    from dataclasses import replace

    from service.state.jobs.store import JobStore
    from service.state.jobs.workers import remove_beat, write_beat
    from service.state.registry import Registry
    from service.state.registry.index import utc_now

    page.goto(f"{live.url}/#models")
    use_key(page)
    row = page.locator(f"#galleries tr[data-gallery={moving}]")
    expect(row.locator(".space")).to_have_text("v1")
    expect(row.locator(".migration-cell")).to_contain_text("up is native to v3")
    assert page.locator("#galleries tr[data-gallery=shapes] button[data-action=migrate]").count() == 0
    # No worker has been seen: the server refuses, and its message is what the person sees.
    row.locator("button[data-action=migrate]").click()
    expect(page.locator("#models-status.error")).to_contain_text("no worker has been seen")
    expect(page.locator("#migrations .migration")).to_have_count(0)

    worker = "browser-test-worker"
    write_beat(live.settings, worker, utc_now())  # a worker's liveness record, nothing runs
    try:
        row.locator("button[data-action=migrate]").click()
        expect(page.locator("#models-status.ok")).to_contain_text("Started migration job")
        panel = page.locator(f"#migrations .migration[data-migration={moving}]")
        expect(panel.locator("h3 .badge")).to_have_text("backfilling")
        expect(panel.locator("[data-field=done]")).to_have_text("0/6")
        expect(panel.locator("[data-field=stage]")).to_have_text("backfill")
        expect(row.locator(".migration-cell")).to_contain_text("v1 → v3 (up)")
        expect(row.locator(".space")).to_have_text("v1")  # still answers through the route
        assert panel.locator("button[data-action=cancel]").count() == 1
        assert panel.locator("button[data-action=switch]").count() == 0

        # A worker's part, through the job store: shard 0 runs and has done 2 of its items.
        # The page polls while the migration backfills: the numbers change without a click.
        job_id = migration_view(live)["job"]
        jobs = JobStore(live.settings.registry_dir)
        assert jobs.start_shard(job_id, 0, f"{worker}@browser:1") is not None
        jobs.beat_shard(job_id, 0, done=2)
        expect(panel.locator("[data-field=done]")).to_have_text("2/6")
        expect(panel.locator("progress")).to_have_attribute("value", "2")
        view = migration_view(live)["progress"]
        assert view["done"] == 2 and view["items_per_s"] > 0 and view["eta_s"] > 0
        # items/s falls as time passes with no more done: shown as a number, then an ETA.
        rate = panel.locator("[data-field='items/s']")
        expect(rate).to_have_text(re.compile(r"^\d+(\.\d+)?$"))
        assert float(rate.text_content()) > 0
        expect(panel.locator("[data-field=ETA]")).to_have_text(re.compile(r"^\d+(\.\d)? (s|min|h)$"))
        expect(panel.locator("[data-field=applied]")).to_have_text("0")
        expect(panel.locator("[data-field=unreadable]")).to_have_text("0")
    finally:
        remove_beat(live.settings, worker)

    # The backfill ends and its gate fails (one update, as the applier would leave it):
    # the switch is offered, and the server's refusals are shown.
    gate = {"passed": False, "metric": "R@1", "checks": [
        {"direction": "t2i", "migrated": 0.41, "routed": 0.52, "passed": False},
        {"direction": "i2t", "migrated": 0.6, "routed": 0.55, "passed": True}]}
    jobs.update(job_id, lambda j: replace(
        j, status="succeeded", ended_at=utc_now(), gate=gate,
        shards=[{**s, "state": "done", "done": s["total"]} for s in j.shards]))
    expect(panel.locator("button[data-action=switch]")).to_be_visible()
    expect(panel.locator(".migration-gate")).to_contain_text("t2i: migrated 0.410 vs routed 0.520")
    expect(panel.locator("[data-field=done]")).to_have_text("6/6")
    assert panel.locator("button[data-action=cancel]").count() == 0
    assert panel.locator("button[data-action=rollback]").count() == 0
    panel.locator("button[data-action=switch]").click()
    expect(page.locator("#models-status.error")).to_contain_text("the migration gate did not pass")
    panel.locator("input[name=reason]").fill("browser drill")
    panel.locator("input[name=force]").check()
    panel.locator("button[data-action=switch]").click()  # forced, but no item has a new vector
    expect(page.locator("#models-status.error")).to_contain_text(
        "6 item(s) of gallery 'moving' have no vector in the new space")
    assert panel.locator("input[name=reason]").input_value() == "browser drill"  # kept
    assert migration_view(live)["state"] == "backfilling"

    # Switched (the registry's move, as a switch with every vector makes it): the page
    # picks it up by itself and offers rollback and retire; both are real calls.
    Registry(live.settings.registry_dir).switch_migration(moving, by="browser-test")
    expect(panel.locator("h3 .badge")).to_have_text("switched")
    expect(row.locator(".space")).to_have_text("v3")
    expect(row).to_contain_text("migrate up into space v3 by browser-test")
    assert panel.locator("button[data-action=switch]").count() == 0
    panel.locator("input[name=reason]").fill("back to the route")
    panel.locator("button[data-action=rollback]").click()
    expect(page.locator("#models-status.ok")).to_contain_text("answers in space v1 again")
    expect(panel.locator("h3 .badge")).to_have_text("rolled_back")
    expect(row.locator(".space")).to_have_text("v1")
    expect(row).to_contain_text("migration-rollback up into space v1 by ops")
    expect(row).to_contain_text("— back to the route")
    assert panel.locator("button[data-action=rollback]").count() == 0
    assert migration_view(live)["state"] == "rolled_back"
    panel.locator("button[data-action=retire]").click()
    expect(page.locator("#models-status.ok")).to_contain_text("the v3 side of moving was deleted")
    expect(page.locator("#migrations .migration")).to_have_count(0)
    expect(row.locator("button[data-action=migrate]")).to_be_visible()  # it can start again
    history = [e["action"] for e in httpx.get(f"{live.url}/v1/galleries/{moving}",
                                              headers=ADMIN).json()["history"]]
    assert history[-2:] == ["migrate", "migration-rollback"]
