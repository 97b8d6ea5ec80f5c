"""Data-parallel training on torch.distributed: one process (rank) per GPU of a host.

``launch`` starts ``gpus`` ranks with ``torch.multiprocessing`` (spawn), each with its
process group (NCCL on ``cuda:rank`` where CUDA is present, gloo on CPU otherwise), and
supervises them from the calling process: rank 0's progress comes back through a queue,
``check`` runs between polls (cancellation), and on any error (a rank failing, ``check``
raising, an interrupt) every rank is stopped before the error propagates. A rank also
dies with its launcher (``PR_SET_PDEATHSIG``), so a killed worker leaves no orphans.

Inside a rank, the rest of ``training/`` reads the ``World`` from torch.distributed
(``World.current()``, as ``DistributedSampler`` does): the batch streams shard each global
batch by rank (``shard``), the loop wraps the trained parameters in DDP (gradients
averaged), and the losses that couple samples see the global batch through ``gather``.

Why ``gather`` keeps gradients (open_clip's ``gather_with_grad``): every rank computes the
same global-batch loss L from the gathered features. The all-gather's backward sums the
feature gradients of all N ranks onto the rank that owns the rows (N dL/df), and DDP's
average divides by N again, so every parameter gets exactly dL/dtheta of one process
with the whole batch: parameters outside the feature path (the logit scale, TEIR's
temperature) included, without rescaling any loss. Gathering without gradients would
give the features' owners only their own rows' paths; DDP's average then scales the
encoders' gradients by 1/N but not the logit scale's. The cost is one all-reduce of the
[B, D] feature gradients per gathered tensor per step (``_GatherWithGrad``: plain,
blocking c10d calls; torch's functional all-gather, used before, crashed a gloo rank
with SIGSEGV in its backward's ``wait_tensor`` about one run in five).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.errors import ConfigError, NobackfillError


class RankFailed(NobackfillError, RuntimeError):
    """A rank of a multi-rank job failed or died; the other ranks were stopped."""


T = TypeVar("T")
Batch = TypeVar("Batch")
PR_SET_PDEATHSIG = 1
POLL_S = 0.2
STOP_GRACE_S = 10.0
GROUP_TIMEOUT = timedelta(minutes=30)  # a collective waiting longer than this fails the job


@dataclass(frozen=True)
class World:
    """This process's place in the job: rank ``rank`` of ``size``, training on ``device``."""

    rank: int = 0
    size: int = 1
    device: torch.device | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, reports progress and writes checkpoints and artifacts."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @classmethod
    def current(cls) -> World:
        """The world of this process: from torch.distributed when a group is initialised,
        else a single process."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        rank = dist.get_rank()
        device = torch.device(f"cuda:{rank}") if dist.get_backend() == "nccl" else \
            torch.device("cpu")
        return cls(rank, dist.get_world_size(), device)

    def local_size(self, global_size: int) -> int:
        """Rows of a global batch this rank takes; ConfigError unless it divides evenly."""
        if global_size % self.size:
            raise ConfigError(f"the batch of {global_size} does not split evenly over "
                              f"{self.size} ranks; choose a batch size divisible by {self.size}")
        return global_size // self.size

    def shard(self, batch: Batch) -> Batch:
        """This rank's contiguous slice of a global batch (a tensor, or a tuple of them with
        the same first dimension): rank r takes rows [r B/N, (r+1) B/N)."""
        if not self.distributed:
            return batch
        if isinstance(batch, tuple):
            return tuple(self.shard(part) for part in batch)  # type: ignore[return-value]
        local = self.local_size(len(batch))
        return batch[self.rank * local:(self.rank + 1) * local]

    def row_range(self, rows: int) -> tuple[int, int]:
        """[lo, hi) of ``rows`` items that this rank processes in a one-off pass (caching
        embeddings, statistics): contiguous blocks of ceil(rows / N)."""
        per = -(-rows // self.size)
        lo = min(self.rank * per, rows)
        return lo, min(lo + per, rows)


def check_batches(gpus: int, **batches: int) -> None:
    """ConfigError naming the first batch size (a global batch) that ``gpus`` ranks cannot
    split evenly (or a ``gpus`` that is no count); run before any rank starts."""
    _check_count(gpus)
    for name, size in batches.items():
        if gpus > 1 and size % gpus:
            raise ConfigError(f"{name}={size} does not split evenly over gpus={gpus}; choose "
                              f"a multiple of {gpus}")


def global_batch_size(requested: int, available: int, world: World | None = None) -> int:
    """The global batch an epoch-based stream uses: ``requested`` (which must split evenly
    over the ranks), at most ``available`` rows, rounded down to a multiple of the ranks."""
    world = world or World.current()
    world.local_size(requested)
    size = min(requested, available)
    size -= size % world.size
    if size < world.size:
        raise ConfigError(f"{available} rows cannot give each of {world.size} rank(s) a "
                          f"sample; use fewer gpus or more data")
    return size


# ---------------------------------------------------------------------- collectives
def gather(features: torch.Tensor) -> torch.Tensor:
    """The global batch [B, ...] from every rank's [B/N, ...] rows, in rank order (the
    order of one process's batch). Differentiable when ``features`` requires grad (see
    the module docstring); a single process gets ``features`` back unchanged."""
    world = World.current()
    if not world.distributed:
        return features
    return _GatherWithGrad.apply(features)


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward (when ``features`` requires grad) gives each rank the sum
    over ranks of the gradient of its own rows: the gathered gradient [B, ...] is
    all-reduced and the rank keeps its slice (a reduce-scatter, written with the all-reduce
    every backend has). Each rank runs the same graph, so the collectives of the backward
    (these and DDP's) start in the same order everywhere."""

    @staticmethod
    def forward(ctx: Any, features: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        world = World.current()
        ctx.rank, ctx.rows = world.rank, len(features)
        local = _to_comm(features, world)
        parts = [torch.empty_like(local) for _ in range(world.size)]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=0).to(features.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        total = all_reduce_sum(grad.contiguous())
        return total[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over ranks (a new tensor; itself in a single process)."""
    world = World.current()
    if not world.distributed:
        return tensor
    total = _to_comm(tensor.detach(), world).clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(tensor.device)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over ranks (e.g. the logged loss); one collective."""
    world = World.current()
    return float(all_reduce_sum(value.detach().reshape(1).double()).item()) / world.size


def broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``tensor`` on every rank (same shape and dtype everywhere)."""
    world = World.current()
    if not world.distributed:
        return tensor
    shared = _to_comm(tensor, world).clone()
    dist.broadcast(shared, src=0)
    return shared.to(tensor.device)


def broadcast_object(value: T) -> T:
    """Rank 0's picklable ``value`` on every rank (for results of non-deterministic or
    hash-order-dependent work, e.g. learning BPE merges, done once on rank 0)."""
    if not World.current().distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def map_rows(rows: int, compute: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """``compute(0, rows)`` computed once over all ranks: each rank computes its block
    [lo, hi) (``World.row_range``) and the blocks are gathered, so every rank ends with
    the same [rows, ...] tensor (e.g. cached embeddings of a corpus)."""
    world = World.current()
    if not world.distributed:
        return compute(0, rows)
    lo, hi = world.row_range(rows)
    local = compute(lo, hi) if hi > lo else None
    shapes: list[Any] = [None] * world.size
    dist.all_gather_object(shapes, None if local is None else (tuple(local.shape[1:]),
                                                               local.dtype))
    tail, dtype = next(s for s in shapes if s is not None)
    per = -(-rows // world.size)
    padded = torch.zeros((per, *tail), dtype=dtype, device=_comm_device(world))
    if local is not None:
        padded[:hi - lo] = local.to(padded.device)
    parts = [torch.empty_like(padded) for _ in range(world.size)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)[:rows].cpu()


def _comm_device(world: World) -> torch.device:
    """Where a collective's tensors must live: the rank's GPU under NCCL, else the CPU."""
    return world.device if world.device is not None else torch.device("cpu")


def _to_comm(tensor: torch.Tensor, world: World) -> torch.Tensor:
    return tensor.to(_comm_device(world)).contiguous()


def on_main(write: Callable[[], T], read: Callable[[], T]) -> T:
    """``write()`` on rank 0 only (an artifact, atomically), then ``read()`` on the other
    ranks once it is done; ``write()`` in a single process."""
    world = World.current()
    if not world.distributed:
        return write()
    value = write() if world.is_main else None
    dist.barrier()
    return value if world.is_main else read()  # type: ignore[return-value]


def ddp(module: torch.nn.Module, world: World | None = None) -> torch.nn.Module:
    """``module`` wrapped in DistributedDataParallel (its parameters broadcast from rank 0,
    their gradients averaged over ranks in backward); unchanged in a single process."""
    world = world or World.current()
    if not world.distributed:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [world.device] if world.device is not None and world.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


# ---------------------------------------------------------------------- devices
def rank_device(rank: int, device: str | None = None) -> torch.device:
    """The device of ``rank``: cuda:rank when CUDA is present (unless ``device`` says
    cpu), else cpu."""
    if device is not None and torch.device(device).type == "cpu":
        return torch.device("cpu")
    return torch.device(f"cuda:{rank}") if torch.cuda.is_available() else torch.device("cpu")


def check_gpus(gpus: int, device: str | None = None) -> str:
    """The backend for ``gpus`` ranks on this host (nccl or gloo); ConfigError when
    ``gpus`` is not a positive count or exceeds what the host has."""
    _check_count(gpus)
    wanted = torch.device(device).type if device else None
    if wanted not in (None, "cpu", "cuda"):
        raise ConfigError(f"multi-rank training runs on cuda or cpu, not {device!r}")
    if wanted != "cpu" and torch.cuda.is_available():
        have = torch.cuda.device_count()
        if gpus > have:
            raise ConfigError(f"gpus={gpus} but this host has {have} visible CUDA device(s) "
                              f"(CUDA_VISIBLE_DEVICES); ask for at most {have}")
        return "nccl"
    if wanted == "cuda":
        raise ConfigError(f"gpus={gpus} on cuda, but this host has no CUDA device")
    cores = os.cpu_count() or 1
    if gpus > cores:
        raise ConfigError(f"gpus={gpus} CPU ranks but this host has {cores} core(s); without "
                          f"CUDA each rank is a CPU process: ask for at most {cores}")
    return "gloo"


def _check_count(gpus: int) -> None:
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ConfigError(f"gpus must be a whole number >= 1, got {gpus!r}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------- launching
@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to join the group (picklable: it crosses the spawn)."""

    size: int
    port: int
    backend: str
    device: str | None
    threads: int


def launch(entry: Callable[[World, Any, Callable[[Any], None] | None], None], payload: Any,
           gpus: int, device: str | None = None,
           on_progress: Callable[[Any], None] | None = None,
           check: Callable[[], None] | None = None, threads: int | None = None) -> None:
    """Run ``entry(world, payload, report)`` on ``gpus`` ranks and wait for all of them.

    ``entry`` must be a module-level function and ``payload`` picklable (spawn).
    ``report`` (rank 0 only; None elsewhere) sends a picklable progress object back,
    where ``on_progress`` receives it; ``check`` runs every poll. Either may raise (e.g.
    a cancellation): every rank is then stopped before the error propagates. A rank's
    failure stops the others and raises ``RankFailed`` naming it.
    """
    backend = check_gpus(gpus, device)
    threads = threads or max(1, (os.cpu_count() or 1) // gpus)
    spec = RankSpec(gpus, free_port(), backend, device, threads)
    context = mp.get_context("spawn")
    messages = context.Queue()
    with _children_allowed():
        procs = mp.start_processes(_rank_main, args=(spec, entry, payload, messages),
                                   nprocs=gpus, join=False, start_method="spawn")
    try:
        _supervise(procs, messages, on_progress, check)
    except BaseException:
        stop_ranks(procs.processes)
        raise
    finally:
        messages.close()
        messages.join_thread()


@dataclass(frozen=True)
class RankError:
    """A rank's exception, sent before it exits. When one rank fails, its peers fail next
    (their collectives lose a member): the first report names the cause."""

    rank: int
    error: str


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Let a Celery prefork pool worker (the task's process) start the ranks.

    Its pool marks it daemonic, and multiprocessing refuses children to daemonic processes
    because they would be orphaned when it is killed; here the launcher reaps every rank
    on every exit path and each rank dies with its launcher (``_die_with_parent``), which
    is what the rule is for. Its process record is billiard's, whose authentication key
    only billiard's own spawning may pickle: spawn gets the same key as the standard
    library's type. Both are restored once the ranks have started."""
    import multiprocessing.process as mp_process

    config = mp_process.current_process()._config  # type: ignore[attr-defined]
    saved = dict(config)
    config.pop("daemon", None)
    if "authkey" in config:
        config["authkey"] = mp_process.AuthenticationString(bytes(config["authkey"]))
    try:
        yield
    finally:
        config.clear()
        config.update(saved)


def _supervise(procs: Any, messages: Any, on_progress: Callable[[Any], None] | None,
               check: Callable[[], None] | None) -> None:
    errors: list[RankError] = []
    done = False
    while not done:
        _drain(messages, on_progress, errors)
        if check is not None:
            check()
        try:
            done = procs.join(timeout=POLL_S)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            _drain(messages, None, errors)
            if errors:
                raise RankFailed(f"rank {errors[0].rank} failed: {errors[0].error}") from None
            raise RankFailed(f"rank {exc.error_index} died ({exc}); the other ranks were "
                             f"stopped") from None
    _drain(messages, on_progress, errors)


def _drain(messages: Any, on_progress: Callable[[Any], None] | None,
           errors: list[RankError]) -> None:
    latest = None
    with contextlib.suppress(queue.Empty):
        while True:
            message = messages.get_nowait()
            if isinstance(message, RankError):
                errors.append(message)
            else:
                latest = message
    if latest is not None and on_progress is not None:
        on_progress(latest)


def stop_ranks(processes: list[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every live rank, SIGKILL what is left after ``grace_s``, and reap them."""
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.kill()
        proc.join()


def _die_with_parent() -> None:
    """SIGKILL this rank when its launcher dies (Linux); elsewhere a watchdog thread."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _rank_main(rank: int, spec: RankSpec, entry: Callable[..., None], payload: Any,
               messages: Any) -> None:
    faulthandler.enable()  # a rank that crashes (a signal) leaves its stack in the log
    _die_with_parent()
    torch.set_num_threads(spec.threads)
    device = rank_device(rank, spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(spec.backend, init_method=f"tcp://127.0.0.1:{spec.port}",
                            rank=rank, world_size=spec.size, timeout=GROUP_TIMEOUT)
    try:
        world = World(rank, spec.size, device)
        entry(world, payload, messages.put if world.is_main else None)
        dist.barrier()  # rank 0's artifact is written before anyone reports success
    except BaseException as exc:
        messages.put(RankError(rank, f"{type(exc).__name__}: {exc}"[:2000]))
        raise
    dist.destroy_process_group()


def run_ranks(gpus: int, fn: Callable[..., Any], kwargs: dict[str, Any],
              device: str | None = None, on_progress: Callable[[Any], None] | None = None,
              check: Callable[[], None] | None = None, threads: int | None = None) -> None:
    """``fn(**kwargs, device=<the rank's device>, on_progress=<rank 0's report>)`` on
    ``gpus`` ranks (``launch``): how a trainer entry point (``train_contrastive``,
    ``run_phase``, ``upgrade``) runs data-parallel. ``fn`` must be module-level and
    ``kwargs`` picklable; ``fn`` writes its artifact on rank 0 only (``on_main``)."""
    launch(_call_entry, (fn, kwargs), gpus, device, on_progress, check, threads)


def train_artifact(gpus: int, fn: Callable[..., Any], kwargs: dict[str, Any],
                   device: str | None = None, on_progress: Callable[[Any], None] | None = None,
                   check: Callable[[], None] | None = None, threads: int | None = None) -> Any:
    """The artifact ``fn(**kwargs)`` writes at ``kwargs["out"]``, trained on ``gpus`` ranks:
    in this process for 1 (as without torch.distributed), else ``run_ranks``."""
    if gpus == 1 and not isinstance(gpus, bool):
        return fn(**kwargs, device=device, on_progress=on_progress)
    from training.artifacts import load_artifact

    run_ranks(gpus, fn, kwargs, device, on_progress, check, threads)
    return load_artifact(kwargs["out"])


def _call_entry(world: World, payload: tuple[Callable[..., Any], dict[str, Any]],
                report: Callable[[Any], None] | None) -> None:
    fn, kwargs = payload
    fn(**kwargs, device=str(world.device), on_progress=report)
