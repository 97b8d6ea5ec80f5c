"""The load generator, run as its own process: ``python -m service.bench.load``.

N clients each send one request at a time (closed loop) for a fixed duration; prints
one JSON line: requests, errors, QPS, p50/p99/mean latency in milliseconds and every
latency (so that runs can be pooled).

It shares the machine with the gateway under test, so it must cost little: it imports
neither torch nor the gateway, and speaks HTTP/1.1 itself over asyncio streams (one
keep-alive connection per client, each request's bytes built once). httpx took about
2.5 ms of CPU per request here, 10 to 15% of the machine at 32 clients, taken from the
server it was measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


class Connection:
    """One keep-alive HTTP/1.1 connection; reopened after the server closes it or fails."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """(status, body) of one request; raises OSError/ValueError when the exchange fails."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        try:
            self.writer.write(request)
            await self.writer.drain()
            status_line = await self.reader.readline()
            if not status_line:
                raise ConnectionError("the server closed the connection")
            status = int(status_line.split(b" ", 2)[1])
            headers = {}
            while (line := await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip().lower()
            if headers.get(b"transfer-encoding") == b"chunked":
                body = await self._chunked()
            else:
                body = await self.reader.readexactly(int(headers.get(b"content-length", 0)))
            if headers.get(b"connection") == b"close":
                self.close()
            return status, body
        except BaseException:
            self.close()
            raise

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts = []
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()
        await self.reader.readline()
        return b"".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def post_json(host: str, port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


async def drive(url: str, bodies: list[dict], concurrency: int, duration: float,
                warmup: float = 0.0) -> dict:
    """Closed loop for ``warmup + duration`` seconds. Only requests that complete inside
    the last ``duration`` seconds count (QPS, latencies): the ramp-up, when all clients
    start at once, and requests still in flight at the end would bias the steady state
    (more for batching, whose first and last batches run part-empty). Every error counts."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [post_json(host, port, parts.path, body) for body in bodies]
    latencies: list[float] = []
    slow: list[tuple[float, float]] = []  # (latency, wall-clock start) of each request
    errors: list[str] = []
    start = time.perf_counter()
    window = start + warmup
    deadline = window + duration

    async def client_loop(worker: int) -> None:
        connection = Connection(host, port)
        n = worker
        try:
            while time.perf_counter() < deadline:
                t0, wall = time.perf_counter(), time.time()
                try:
                    status, body = await connection.send(requests[n % len(requests)])
                except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                else:
                    done = time.perf_counter()
                    if status != 200:
                        errors.append(f"{status}: {body[:200].decode(errors='replace')}")
                    elif window <= done <= deadline:
                        latencies.append(done - t0)
                        slow.append((done - t0, wall))
                n += concurrency
        finally:
            connection.close()

    await asyncio.gather(*(client_loop(w) for w in range(concurrency)))
    return {"concurrency": concurrency, "requests": len(latencies), "errors": len(errors),
            "first_error": errors[0] if errors else None, "seconds": duration,
            "warmup_s": warmup, "qps": len(latencies) / duration,
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000,
            "mean_ms": sum(latencies) / max(1, len(latencies)) * 1000,
            "latencies_ms": [round(x * 1000, 3) for x in latencies],
            # the 10 slowest, to set beside a log: [ms, UTC start]
            "slowest": [[round(lat * 1000, 1), time.strftime("%H:%M:%S", time.gmtime(at))
                         + f".{int(at % 1 * 1000):03d}"] for lat, at in sorted(slow)[-10:]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--queries", required=True, help="JSON file: {texts: [...], images: [...]}")
    p.add_argument("--modality", choices=("text", "image"), required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--duration", type=float, required=True, help="seconds measured")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="seconds of load before the measured window")
    p.add_argument("--top-k", type=int, default=10)
    args = p.parse_args()
    with open(args.queries) as fh:
        queries = json.load(fh)
    key = "text" if args.modality == "text" else "image_base64"
    bodies = [{key: q, "top_k": args.top_k} for q in queries[f"{args.modality}s"]]
    result = asyncio.run(drive(args.url, bodies, args.concurrency, args.duration, args.warmup))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
