"""The prompts of the vLLM tests: three prompts sharing a 10-block prefix."""

from __future__ import annotations

from bench.vllm_engines import BLOCK_SIZE

PREFIX = [(7 * i + 3) % 500 + 3 for i in range(10 * BLOCK_SIZE)]  # 10 full blocks
PROMPTS = [PREFIX + [11 + j, 400 + j, 17] for j in range(3)]
# what a load can supply: every full block except a prompt's last token's
LOADABLE = (len(PROMPTS[0]) - 1) // BLOCK_SIZE * BLOCK_SIZE
