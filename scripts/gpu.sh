#!/usr/bin/env bash
# One call on the GPU machine: run the `-m gpu` tests and every GPU-relevant bench, and write
# results under $OUT (the device tool brings them back; copy them to bench/results/).
# BENCHES="transfer|ttft" runs some benches only (BENCHES="" none); GPU_TESTS=tests/gpu/x.py some
# tests only.
# The GPU machine has its own Python and torch and no package index: missing wheels travel in
# .whl/ (see the device tool's README) and are installed to /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
# the tests' Redis fixtures run redis-server from the PATH; the GPU machine has none: the carried
# .redis/ (the binary and its libraries) goes on it through a wrapper that finds those libraries
if [ -x .redis/redis-server ] && ! command -v redis-server >/dev/null; then
    mkdir -p /tmp/redis-bin
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PWD/.redis" "$PWD/.redis/redis-server" \
        > /tmp/redis-bin/redis-server
    chmod +x /tmp/redis-bin/redis-server
    export PATH="/tmp/redis-bin:$PATH"
fi
# the commit the results come from: `git rev-parse HEAD > .commit` here, then carry .commit
# (ignored, like .whl) -- the machine's copy of the tree does not carry its history
[ -f .commit ] && export KVSTORE_GIT_COMMIT="$(cat .commit)"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' | tee -a "$OUT/gpu.txt"
rc=0
# the CUDA kernels build on first use (nvcc); build them now so a failure is visible here
KVSTORE_NATIVE=1 python3 -c 'import torch; from kvstore.ops import copy_rows_native_active as a; print("copy_rows kernel:", a())' 2>&1 | tee -a "$OUT/gpu.txt" || rc=1
# the -m gpu tests live in tests/gpu and tests/connector (the rest needs packages, such as the
# daemon's grpc health service, that the GPU machine lacks)
python3 -m pytest -q -m gpu ${GPU_TESTS:-tests/gpu tests/connector} -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" || rc=1
BENCHES=${BENCHES-"transfer|tiers --tier host|tiers --tier disk|lookup|ttft|decode|writeback --device cuda"}  # "": none
IFS='|' read -ra list <<< "$BENCHES"
: > "$OUT/recorded.txt"
for b in "${list[@]+"${list[@]}"}"; do
    python3 -m bench.$b --json --record 2>>"$OUT/bench-stderr.txt" | tee -a "$OUT/bench.jsonl" || rc=1
done
# only the results this call recorded (the device tool brings back a few files per call)
find bench/results -name '*-h[12]00.json' -newer "$OUT/recorded.txt" -exec cp {} "$OUT/" \;
exit $rc
