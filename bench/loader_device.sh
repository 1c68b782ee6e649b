#!/usr/bin/env bash
# Issue 2's loader benchmark on a machine with a core per worker (the GPU machine: 16 cores), plus
# the pinned-memory copy to the GPU, in one run that writes everything under $OUT.
#
# The dev machine has 2 cores: two workers and the training process share them, which caps two
# workers at ~0.62 of the raw scan each (bench_loader.py prints that bound). This settles the
# per-worker figure where each worker has its own core.
#
# The GPU image already holds everything this needs (numba, llvmlite, pyarrow, torch, lightning, tqdm,
# pyyaml: .library/device/KINDS.md, 2026-11-17); wheels carried in .whl are installed first if present.
# Through the device tool, from the repository root:
#     bash bench/loader_device.sh
# It makes 5M synthetic rows (~20 s), runs bench_loader.py with 1, 2 and 4 workers (and 2 with an idle
# training process, the per-stage CPU split, and other plain reads against the raw scan) and
# pinned_check.py, and leaves loader.json, pinned.json and their printed tables in $OUT (bench/out
# without $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench/out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$HOME/site" .whl/*.whl
  export PYTHONPATH="$HOME/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
python3 -c "import numba, pyarrow, torch; print('numba', numba.__version__, 'pyarrow', pyarrow.__version__, \
'torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/versions.txt"
nproc | tee "$OUT/cores.txt"

# Smaller values make a smoke test: DATA=/tmp/smoke ROWS=200000 LIMIT=100000 REPEATS=1 MEMORY=1 VARIANTS=1
DATA=${DATA:-/tmp/bench_synth}
python3 bench/bench_loader.py --data "$DATA" --rows "${ROWS:-5000000}" --limit "${LIMIT:-2000000}" \
  --repeats "${REPEATS:-3}" --workers 1 2 4 --unpadded 2 --stages 256 1024 --raw-variants "${VARIANTS:-5}" \
  --memory-files ${MEMORY:-1 2 5} --json "$OUT/loader.json" 2>&1 \
  | tee "$OUT/loader.txt"
python3 bench/pinned_check.py --data "$DATA" --workers 2 --batches "${BATCHES:-400}" --json "$OUT/pinned.json" \
  2>&1 | tee "$OUT/pinned.txt"
