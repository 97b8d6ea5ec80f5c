#!/usr/bin/env bash
# The CUDA check of a GPU host (docs/how-to/deploy.md, "Check the GPU path"): with CUDA
# present every training method picks it, so this runs the training tests there, trains
# bench base's OLD and NEW on the GPU, and runs one NCCL rank of the data-parallel trainer.
# Needs the package importable (installed, or PYTHONPATH=repo root); writes to $OUT.
set -u -o pipefail
OUT=${OUT:-runs/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
NOBACKFILL=("$PY" -c 'import sys; from training.cli import main; sys.exit(main(sys.argv[1:]))')

{ nvidia-smi -L; "$PY" -c '
import torch, open_clip, peft
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0),
      "open_clip", open_clip.__version__, "peft", peft.__version__)'; } 2>&1 | tee "$OUT/gpu.txt"

# the training tests (methods, XBT, adapters, transforms, data-parallel) with CUDA present
timeout "${TEST_S:-240}" "$PY" -m pytest -q -p no:cacheprovider --durations=5 \
    tests/test_continual.py tests/test_xbt.py tests/test_xbt_resume.py \
    tests/test_base_training.py tests/test_distributed.py \
    tests/test_adapters.py tests/test_transform.py tests/test_method_config.py \
    tests/test_evaluate.py tests/test_artifacts.py 2>&1 | tail -n 40 > "$OUT/tests.txt"
echo "tests: exit ${PIPESTATUS[0]}; $(tail -n 1 "$OUT/tests.txt")"

# bench base on the GPU: its R@1 against the CPU run's (docs/benchmarks/base.md), and time
rm -rf /tmp/gpu-bench-base
timeout "${BASE_S:-240}" "${NOBACKFILL[@]}" bench base --out /tmp/gpu-bench-base --json \
    > "$OUT/bench-base.json" 2> "$OUT/bench-base.err"
echo "bench base: exit $?"
"$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
for n in ("old", "new"):
    print(n, "t2i R@1 %.3f i2t R@1 %.3f, %.0f s" % (r[n]["t2i"]["R@1"], r[n]["i2t"]["R@1"], r[n]["seconds"]))
print("targets", r["targets"])' "$OUT/bench-base.json" 2>&1 | tee -a "$OUT/gpu.txt"

# one NCCL rank of the data-parallel trainer
timeout "${DIST_S:-90}" "${NOBACKFILL[@]}" bench distributed --device cuda --ranks 1 --steps 50 \
    --batch-size 256 2>&1 | tail -n 4 | tee -a "$OUT/gpu.txt"
