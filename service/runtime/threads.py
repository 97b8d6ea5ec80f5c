"""How many threads numpy's BLAS may use in the gateway process.

The gateway's own numpy work is small (the embedded Qdrant's brute-force search, one
[D] x [N, D] product per query), but OpenBLAS keeps its idle threads spinning for a
while after every call, on the same cores as the next model forward. On a 2-core host
that roughly halved a ViT-B-32 text query's encode time when set to one thread
(53 -> 25 ms, ``nobackfill bench serve``). torch's own thread pool is not touched.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def limit_blas_threads(threads: int) -> None:
    """Cap every BLAS library loaded in this process at ``threads``; 0 leaves them alone.
    Applies from now on, for the whole process."""
    if threads > 0:
        threadpool_limits(limits=threads, user_api="blas")
