"""The demo talks to the running gateway through its public HTTP API, as an operator would."""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx

from service.api.deps import API_KEY_HEADER
from service.usecases.media import png_base64
from training.data import PairDataset
from training.errors import NobackfillError

TERMINAL = ("succeeded", "failed", "cancelled")


class DemoError(NobackfillError):
    """A step of the story could not be carried out (the message names the call)."""


class Client:
    def __init__(self, url: str, admin_key: str, gallery: str) -> None:
        self.http = httpx.Client(base_url=url, headers={API_KEY_HEADER: admin_key},
                                 timeout=600)
        self.gallery = gallery

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise DemoError(f"{method} {path} answered {response.status_code}: "
                            f"{response.text[:500]}")
        return response.json()

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------ gallery and models
    def info(self) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/galleries/{self.gallery}"))

    def wait_serving(self, timeout_s: float = 120) -> str:
        """Wait until this gateway serves the gallery with its active version (a replica
        swaps when its registry watcher sees a promotion); that version."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.info()
            serving = (info.get("serving") or {}).get("version")
            if serving == info["active"]:
                return str(serving)
            if time.monotonic() > deadline:
                raise DemoError(f"the gateway still serves '{serving}', not the active "
                                f"'{info['active']}', after {timeout_s:.0f} s")
            time.sleep(0.5)

    def wait_space(self, space: str, timeout_s: float = 120) -> None:
        """Wait until searches of the gallery answer in ``space`` (a replica serves a
        switched gallery once it refreshed)."""
        deadline = time.monotonic() + timeout_s
        while (answered := self.search("a", 1)["space"]) != space:
            if time.monotonic() > deadline:
                raise DemoError(f"gallery '{self.gallery}' still answers in space "
                                f"'{answered}', not '{space}', after {timeout_s:.0f} s")
            time.sleep(0.5)

    def ingest(self, dataset: PairDataset, batch: int = 64) -> dict[str, int]:
        """Upload every image (base64 JSON) with its first English caption and domain;
        items stored per version that embedded them."""
        done: dict[str, int] = {}
        for first in range(0, len(dataset), batch):
            items = []
            for i in range(first, min(first + batch, len(dataset))):
                record = dataset.records[i]
                items.append({"id": record.id,
                              "image_base64": png_base64(dataset.load_image(i)),
                              "payload": {"caption": record.captions["en"][0],
                                          "domain": record.domain}})
            answer = self.call("POST", f"/v1/galleries/{self.gallery}/items",
                               json={"items": items})
            done[answer["version"]] = done.get(answer["version"], 0) + int(answer["count"])
        return done

    def register(self, source: str) -> dict[str, Any]:
        return dict(self.call("POST", "/v1/models", json={"source": source}))

    def activate(self, version: str, reason: str) -> dict[str, Any]:
        """Make ``version`` serve the gallery again (a rollback: it served before)."""
        return dict(self.call("POST", f"/v1/models/{version}/rollback",
                              json={"gallery": self.gallery, "reason": reason}))

    def search(self, text: str, top_k: int) -> dict[str, Any]:
        return dict(self.call("POST", f"/v1/galleries/{self.gallery}/search",
                              json={"text": text, "top_k": top_k}))

    # ------------------------------------------------------------ jobs
    def run_job(self, kind: str, params: dict[str, Any], label: str,
                timeout_s: float = 3600) -> dict[str, Any]:
        """Submit a job with auto-promotion, follow its progress on one line, return the
        finished record; DemoError if it did not succeed."""
        job = self.call("POST", "/v1/jobs", json={"kind": kind, "gallery": self.gallery,
                                                   "params": params, "auto_promote": True})
        deadline, shown = time.monotonic() + timeout_s, ""
        while job["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                self.call("DELETE", f"/v1/jobs/{job['id']}")
                raise DemoError(f"{label}: job {job['id']} did not finish in {timeout_s:.0f} s")
            time.sleep(1.0)
            job = self.call("GET", f"/v1/jobs/{job['id']}")
            line = _progress_line(label, job)
            if line != shown and sys.stderr.isatty():
                print(f"\r{line:100}", end="", file=sys.stderr, flush=True)
            shown = line
        if sys.stderr.isatty():
            print(file=sys.stderr)
        if job["status"] != "succeeded":
            raise DemoError(f"{label}: job {job['id']} {job['status']}: {job.get('error')}")
        return dict(job)


    # ------------------------------------------------------------ migration
    def migration_path(self, action: str = "") -> str:
        return f"/v1/galleries/{self.gallery}/migration" + (f"/{action}" if action else "")

    def migration(self) -> dict[str, Any] | None:
        """GET .../migration; None when the gallery has none open (404)."""
        response = self.http.get(self.migration_path())
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise DemoError(f"GET {self.migration_path()} answered {response.status_code}: "
                            f"{response.text[:500]}")
        return dict(response.json())

    def wait_migration(self, job_id: str, label: str, timeout_s: float = 3600,
                       on_view: Any = None) -> dict[str, Any]:
        """Poll the migration of job ``job_id`` until it switched, or its job succeeded
        and the switch was refused (the operator decides then); the last view. Progress
        goes to ``on_view`` (every view) and, on a terminal, to one line of stderr.
        DemoError when the job failed or was cancelled (the migration is undone then)."""
        deadline = time.monotonic() + timeout_s
        shown = ""
        try:
            while True:
                view = self.migration()
                if view is not None and view["job"] == job_id:
                    if on_view is not None:
                        on_view(view)
                    line = _migration_line(label, view)
                    if line != shown and sys.stderr.isatty():
                        print(f"\r{line:100}", end="", file=sys.stderr, flush=True)
                    shown = line
                    if view["state"] != "backfilling":
                        return view
                    if view["job_status"] == "succeeded" and "switched" in view["result"]:
                        return view  # complete, not switched: the operator's call
                job = self.call("GET", f"/v1/jobs/{job_id}")
                if job["status"] in ("failed", "cancelled"):
                    raise DemoError(f"{label}: job {job_id} {job['status']}: {job.get('error')}")
                if time.monotonic() > deadline:
                    self.call("DELETE", f"/v1/jobs/{job_id}")
                    raise DemoError(f"{label}: job {job_id} did not finish in "
                                    f"{timeout_s:.0f} s; it was cancelled")
                time.sleep(0.5)
        finally:
            if shown and sys.stderr.isatty():
                print(file=sys.stderr)


def _migration_line(label: str, view: dict[str, Any]) -> str:
    p = view.get("progress") or {}
    rate, eta = p.get("items_per_s"), p.get("eta_s")
    return (f"{label}: {view['state']}, {p.get('stage', '?')} {p.get('done', 0)}/"
            f"{p.get('total', '?')} items"
            + (f", {rate:.1f} items/s" if isinstance(rate, (int, float)) else "")
            + (f", ETA {eta:.0f} s" if isinstance(eta, (int, float)) else ""))


def _progress_line(label: str, job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if "step" not in p:
        return f"{label}: {job['status']} {p.get('stage', '')}".rstrip()
    eta = p.get("eta_s")
    return (f"{label}: {p.get('stage', '')} step {p['step']}/{p.get('total', '?')}"
            + (f", ETA {eta:.0f} s" if isinstance(eta, (int, float)) else ""))
