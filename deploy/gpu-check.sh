#!/usr/bin/env bash
# The check of a GPU host (docs/how-to/deploy.md, "Check the GPU path"), one command within
# 6 minutes on one GPU: the training path (the training tests with CUDA present, bench
# base's OLD and NEW trained on the GPU, one NCCL rank of the data-parallel trainer), then
# the serving and migration path on the models it trained (bench migrate --transform
# --reads at 10,000 items, bench rerank, bench serve --quick), each part under its own time
# limit, nvidia-smi sampling the GPU's utilisation meanwhile; at the end one table
# (nobackfill bench host-report $OUT): device, utilisation, the encoder's and the
# backfill's items/s and their ratio, search p50/p99 idle and during the migration, cold
# and warm rerank ratios.
#
# QUICK=1: every part at its smallest, on whatever device there is (the CPU in CI): a few
# training tests, no bench base (migrate and rerank use random tiny models, --quick).
# Needs the package importable (installed, or PYTHONPATH=repo root); writes to $OUT.
set -u -o pipefail
OUT=${OUT:-runs/gpu-check}
PY=${PY:-python3}
QUICK=${QUICK:-0}
BASE=${BASE:-/tmp/gpu-bench-base}
mkdir -p "$OUT"
rm -f "$OUT"/*.status "$OUT"/bench-*.json "$OUT/gpu-util.csv"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
NOBACKFILL=("$PY" -c 'import sys; from training.cli import main; sys.exit(main(sys.argv[1:]))')
if [ "$QUICK" = 1 ]; then DEVICE=${DEVICE:-auto}; else DEVICE=${DEVICE:-cuda}; fi

# part NAME LIMIT_S STDOUT STDERR CMD...: CMD under a time limit, its output into the two
# files; "EXIT SECONDS" into $OUT/NAME.status
part() {
    local name=$1 limit=$2 out=$3 err=$4 t0 code
    shift 4
    echo "== $name (limit ${limit} s)"
    t0=$(date +%s%N)
    timeout "$limit" "$@" > "$out" 2> "$err"
    code=$?
    printf '%s %d.%03d\n' "$code" $(( ($(date +%s%N) - t0) / 1000000000 )) \
        $(( ($(date +%s%N) - t0) / 1000000 % 1000 )) > "$OUT/$name.status"
    echo "== $name: exit $code"
}

{ nvidia-smi -L 2>/dev/null || echo "no GPU (nvidia-smi not found or no device)"; "$PY" -c '
import torch, open_clip, peft
cuda = torch.cuda.is_available()
print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if cuda else "(no CUDA device)",
      "open_clip", open_clip.__version__, "peft", peft.__version__)'; } 2>&1 | tee "$OUT/gpu.txt"

SAMPLER=
if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 \
        > "$OUT/gpu-util.csv" 2> /dev/null &
    SAMPLER=$!
fi
trap '[ -n "$SAMPLER" ] && kill "$SAMPLER" 2> /dev/null' EXIT

# 1. the training tests with CUDA present (every training method picks it)
if [ "$QUICK" = 1 ]; then
    TESTS=(tests/test_method_config.py tests/test_artifacts.py)
else
    TESTS=(tests/test_base_training.py tests/test_distributed.py tests/test_xbt.py
           tests/test_adapters.py tests/test_transform.py tests/test_continual.py)
fi
part tests "${TEST_S:-75}" "$OUT/tests.txt" "$OUT/tests.err" \
    "$PY" -m pytest -q -p no:cacheprovider -x "${TESTS[@]}"
tail -n 1 "$OUT/tests.txt"

# 2. bench base on the GPU: OLD and NEW, their R@1 against the CPU run's
#    (docs/benchmarks/base.md); the serving parts below use these models
if [ "$QUICK" != 1 ]; then
    rm -rf "$BASE"
    part bench-base "${BASE_S:-150}" "$OUT/bench-base.json" "$OUT/bench-base.err" \
        "${NOBACKFILL[@]}" bench base --out "$BASE" --json
    # one NCCL rank of the data-parallel trainer
    part distributed "${DIST_S:-25}" "$OUT/distributed.txt" "$OUT/distributed.err" \
        "${NOBACKFILL[@]}" bench distributed --device cuda --ranks 1 --steps 30 \
        --batch-size 256
    tail -n 2 "$OUT/distributed.txt"
    SIZE=(--base "$BASE")
    MIGRATE=(--items 10000 --sample 5000 --duration 6 --clients 4)
    RERANK=(--items 10000 --sample 5000 --queries 60 --writes 64)
else
    SIZE=(--quick)
    MIGRATE=()
    RERANK=()
fi

# 3. the migration with the transform and reranked reads, on the device
part bench-migrate "${MIGRATE_S:-75}" "$OUT/bench-migrate.json" "$OUT/bench-migrate.err" \
    "${NOBACKFILL[@]}" bench migrate "${SIZE[@]}" "${MIGRATE[@]}" --transform --reads \
    --device "$DEVICE" --out "$OUT/migrate" --json
# 4. rerank on read: plain and reranked searches interleaved, cold and warm
part bench-rerank "${RERANK_S:-60}" "$OUT/bench-rerank.json" "$OUT/bench-rerank.err" \
    "${NOBACKFILL[@]}" bench rerank "${SIZE[@]}" "${RERANK[@]}" --device "$DEVICE" \
    --out "$OUT/rerank" --json
# 5. the gateway's batched search
part bench-serve "${SERVE_S:-25}" "$OUT/bench-serve.json" "$OUT/bench-serve.err" \
    "${NOBACKFILL[@]}" bench serve --quick --device "$DEVICE" --out "$OUT/serve" --json

[ -n "$SAMPLER" ] && kill "$SAMPLER" 2> /dev/null
"${NOBACKFILL[@]}" bench host-report "$OUT" | tee "$OUT/table.md"
