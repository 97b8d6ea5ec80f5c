"""``nobackfill bench images``: what a burst of max-size image searches costs the gateway's
memory, measured on a real gateway process (``python -m service``, embedded Qdrant, a tiny
random model, every image limit at its default).

The image is the largest PNG under ``NOBACKFILL_MAX_IMAGE_PIXELS`` (6,030 x 6,633 at the
default 40 MP), highly compressible (about 170 KB, like the 131 KB 6,000 x 6,600 PNG of
issue 30). The gateway's resident memory (VmRSS in ``/proc/<pid>/status``) is read at
idle, after a warm-up of ordinary text and image searches; sampled every few milliseconds
while ``--clients`` concurrent clients each POST the image to the search route (multipart,
no key: search is public without a read key), with the kernel's peak (VmHWM, reset just
before the burst) as a cross-check between samples; and again ``--settle`` seconds after
the last answer. Targets: peak <= idle + 300 MB, and after <= idle + 100 MB.

Plugged into the CLI through the ``nobackfill.benchmarks`` entry point; also runs as
``python -m service.bench.images``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from training.console import report_command

PEAK_MB = 300  # burst peak over idle
AFTER_MB = 100  # over idle, --settle seconds after the burst
POINTS = 256  # gallery size (the search itself is not what is measured)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="gateway memory (RSS) idle, during concurrent max-size "
                                  "image searches, and a minute after")
    add_arguments(p)
    p.set_defaults(func=report_command(run, render))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/bench-images", help="results, logs and work files")
    p.add_argument("--clients", type=int, default=16, help="concurrent image searches")
    p.add_argument("--settle", type=float, default=60.0,
                   help="seconds after the burst before RSS is read again")
    p.add_argument("--size", default=None,
                   help="WIDTHxHEIGHT of the PNG (default: the largest 10:11 image under the "
                        "gateway's max image pixels)")
    p.add_argument("--sample-ms", type=float, default=5.0, help="RSS sampling period")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra NOBACKFILL_* settings for the gateway (repeatable), e.g. "
                        "NOBACKFILL_DECODE_PIXEL_BUDGET=80000000")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.bench.setup import GALLERY, fresh_work_dir
    from service.stack.launch import gateway_child
    from service.state.config import Settings

    out = Path(args.out)
    work = fresh_work_dir(out)
    extra = dict(item.split("=", 1) for item in args.env)
    limit = int(extra.get("NOBACKFILL_MAX_IMAGE_PIXELS",
                          Settings.model_fields["max_image_pixels"].default))
    width, height = _size(args.size, limit)
    png = big_png(width, height)
    setup = _gallery(work)
    env: dict[str, str | None] = {
        # the image limits and the decode budget at their defaults unless --env sets them
        **{name: None for name in ("NOBACKFILL_MAX_IMAGE_PIXELS", "NOBACKFILL_MAX_IMAGE_BYTES",
                                   "NOBACKFILL_MAX_REQUEST_BYTES", "NOBACKFILL_READ_API_KEY",
                                   "NOBACKFILL_DECODE_PIXEL_BUDGET", "NOBACKFILL_DECODE_WAIT_S")},
        "NOBACKFILL_DATA_DIR": str(work / "data"), "NOBACKFILL_DEVICE": "cpu",
        "NOBACKFILL_REGISTRY_POLL_INTERVAL_S": "0", "NOBACKFILL_APPLY_INTERVAL_S": "0",
        "NOBACKFILL_ACCESS_LOG": "false", "NOBACKFILL_BOOTSTRAP": "false", **extra}
    result: dict[str, Any] = {"image": {"width": width, "height": height, "pixels": width * height,
                                        "png_bytes": len(png), "max_image_pixels": limit},
                              "clients": args.clients, "settle_s": args.settle,
                              "gallery": setup, "env": extra}
    url_path = f"/v1/galleries/{GALLERY}/search"
    with gateway_child(env, work / "gateway.log") as (url, proc):
        rss = Rss(proc.pid)
        _warm_up(url + url_path)
        time.sleep(2.0)
        idle = rss.steady()
        hwm_reset = rss.reset_peak()
        with rss.sampling(args.sample_ms / 1000) as samples:
            answers = _burst(url + url_path, png, args.clients)
        peak = max(max(samples, default=0), rss.peak() if hwm_reset else 0)
        settle = _settle(rss, args.settle)
    result.update({
        "rss_mb": {"idle": _mb(idle), "peak": _mb(peak), "peak_over_idle": _mb(peak - idle),
                   "after": _mb(settle[-1][1]), "after_over_idle": _mb(settle[-1][1] - idle)},
        "peak_from": "samples and VmHWM" if hwm_reset else "samples",
        "samples": len(samples),
        "settle_mb": [[round(t, 1), _mb(v)] for t, v in settle],
        "requests": _summary(answers)})
    result["targets"] = targets(result)
    (out / "bench-images.json").write_text(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


# ------------------------------------------------------------------ what is sent
def _size(text: str | None, limit: int) -> tuple[int, int]:
    if text:
        width, height = (int(v) for v in text.lower().split("x"))
        return width, height
    width = math.isqrt(limit * 10 // 11)
    while width * (width * 11 // 10) > limit:
        width -= 1
    return width, width * 11 // 10


def big_png(width: int, height: int) -> bytes:
    """A highly compressible RGB PNG: coloured stripes and ellipses on a flat ground."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (200, 120, 40))
    draw = ImageDraw.Draw(image)
    for x in range(0, width, 300):
        draw.rectangle((x, 0, x + 150, height), fill=(x % 255, 50, 200))
    for y in range(0, height, 400):
        draw.ellipse((100, y, 900, y + 300), fill=(10, 240, 10))
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=9)
    return buf.getvalue()


def _gallery(work: Path) -> dict[str, Any]:
    from service.bench.setup import build_gallery
    from service.state.config import Settings
    from training.configs import config_path
    from training.encoders import ModelSpec

    settings = Settings(data_dir=work / "data", device="cpu")
    return build_gallery(settings, ModelSpec.from_json(config_path("tiny-old")), POINTS, 64,
                         work)


def _warm_up(url: str) -> None:
    """Ordinary queries first: what a serving gateway holds anyway counts as idle."""
    from service.bench.setup import make_queries

    queries = make_queries(n_texts=8, n_images=8)
    with httpx.Client(timeout=120) as client:
        for _ in range(3):
            for text, image in zip(queries.texts, queries.images, strict=True):
                for body in ({"text": text}, {"image_base64": image}):
                    client.post(url, json=body).raise_for_status()


def _burst(url: str, png: bytes, clients: int) -> list[dict[str, Any]]:
    """``clients`` searches with the image, sent at once (one connection each)."""
    start = threading.Barrier(clients)
    answers: list[dict[str, Any]] = [{} for _ in range(clients)]

    def client(n: int) -> None:
        with httpx.Client(timeout=600) as http:
            start.wait()
            began = time.perf_counter()
            try:
                r = http.post(url, files={"image": ("big.png", png, "image/png")},
                              data={"top_k": "5"})
                answers[n] = {"status": r.status_code, "ms": (time.perf_counter() - began) * 1e3,
                              "error": None if r.is_success else r.text[:200]}
            except httpx.HTTPError as exc:
                answers[n] = {"status": None, "ms": (time.perf_counter() - began) * 1e3,
                              "error": repr(exc)[:200]}

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _settle(rss: Rss, seconds: float) -> list[tuple[float, int]]:
    """RSS at 0, 1, 5, 15, 30 s ... after the burst, and at ``seconds``."""
    marks = sorted({0.0, *(m for m in (1.0, 5.0, 15.0, 30.0) if m < seconds), seconds})
    began = time.monotonic()
    out = []
    for mark in marks:
        time.sleep(max(0.0, began + mark - time.monotonic()))
        out.append((time.monotonic() - began, rss.read()))
    return out


# ------------------------------------------------------------------ reading memory
class Rss:
    """A process's resident set from ``/proc``, in bytes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def _field(self, name: str) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {name} in /proc/{self.pid}/status")

    def read(self) -> int:
        return self._field("VmRSS")

    def peak(self) -> int:
        return self._field("VmHWM")

    def steady(self, reads: int = 5, gap_s: float = 0.1) -> float:
        """The median of a few reads ``gap_s`` apart."""
        values = []
        for _ in range(reads):
            values.append(self.read())
            time.sleep(gap_s)
        return statistics.median(values)

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux 4.0+); False where it cannot be."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as clear:
                clear.write("5")
        except OSError:
            return False
        return True

    @contextlib.contextmanager
    def sampling(self, period_s: float) -> Iterator[list[int]]:
        """RSS every ``period_s`` in a thread while the block runs."""
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, RuntimeError):
                    samples.append(self.read())
                stop.wait(period_s)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield samples
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(OSError, RuntimeError):
                samples.append(self.read())


def _mb(value: float) -> float:
    return round(value / 2**20, 1)


def _summary(answers: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [a["ms"] for a in answers if a["status"] == 200]
    errors = [a for a in answers if a["status"] != 200]
    statuses: dict[str, int] = {}
    for a in answers:
        statuses[str(a["status"])] = statuses.get(str(a["status"]), 0) + 1
    return {"sent": len(answers), "ok": len(ok), "statuses": statuses,
            "p50_ms": round(statistics.median(ok), 1) if ok else None,
            "max_ms": round(max(ok), 1) if ok else None,
            "first_error": errors[0]["error"] if errors else None}


# ------------------------------------------------------------------ report
def targets(result: dict[str, Any]) -> dict[str, Any]:
    rss, req = result["rss_mb"], result["requests"]
    return {
        f"peak - idle <= {PEAK_MB} MB": {"value": rss["peak_over_idle"],
                                         "met": rss["peak_over_idle"] <= PEAK_MB},
        f"after {result['settle_s']:g} s - idle <= {AFTER_MB} MB": {
            "value": rss["after_over_idle"], "met": rss["after_over_idle"] <= AFTER_MB},
        "every search answered 200": {"value": f"{req['ok']}/{req['sent']}",
                                      "met": req["ok"] == req["sent"]},
    }


def render(result: dict[str, Any]) -> str:
    image, rss, req = result["image"], result["rss_mb"], result["requests"]
    lines = [(f"bench images: {result['clients']} concurrent searches, each a "
              f"{image['width']}x{image['height']} PNG ({image['pixels'] / 1e6:.1f} MP, "
              f"{image['png_bytes'] / 1e3:.0f} KB; limit {image['max_image_pixels'] / 1e6:g} MP)"
              + (f", settings {result['env']}" if result["env"] else "")), "",
             "| gateway RSS | MB | over idle |", "|---|---|---|",
             f"| idle | {rss['idle']} | |",
             (f"| peak during the burst ({result['peak_from']}) | {rss['peak']} | "
             f"{rss['peak_over_idle']} |"),
             f"| {result['settle_s']:g} s after | {rss['after']} | {rss['after_over_idle']} |",
             "", "after the burst: " + ", ".join(f"{t:g} s {v} MB"
                                                 for t, v in result["settle_mb"]),
             (f"searches: {req['ok']}/{req['sent']} answered 200 (statuses {req['statuses']}), "
              f"p50 {req['p50_ms']} ms, slowest {req['max_ms']} ms"
              + (f"; first error: {req['first_error']}" if req["first_error"] else "")), ""]
    lines += [f"target {name}: {'met' if check['met'] else 'MISSED'} ({check['value']})"
              for name, check in result["targets"].items()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m service.bench.images",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return report_command(run, render)(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
