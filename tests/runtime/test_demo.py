"""``kvstore demo`` as a user runs it (a real process): options accept only what works, readable
headers, no meaningless turn-1 speedup, progress while it works, and a Hugging Face checkpoint
directory with or without its tokenizer.json."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.demo import SYSTEM_PROMPT, USER_TURNS

ROOT = Path(__file__).parents[2]


def _demo(*args: str, merge: bool = False) -> subprocess.CompletedProcess[str]:
    """``kvstore demo ARGS`` in a fresh process, unbuffered (output appears in the order it is
    written), at a known width; ``merge`` sends stderr into stdout."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "server.cli", "demo", *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        timeout=280,
    )


def test_turns_beyond_the_scripted_chat_are_refused_with_the_range() -> None:
    proc = _demo("--turns", str(len(USER_TURNS) + 1))
    assert proc.returncode == 2
    assert ("Invalid value for '--turns': Input should be less than or equal to "
            f"{len(USER_TURNS)}") in proc.stderr


def test_help_states_the_real_ranges() -> None:
    proc = _demo("--help")
    assert proc.returncode == 0, proc.stderr
    assert f"1<=x<={len(USER_TURNS)}" in proc.stdout
    assert "Hugging Face checkpoint directory" in proc.stdout
    assert "tiny" not in proc.stdout and "llama3-8b" not in proc.stdout


@pytest.mark.parametrize(("model", "message"), [
    ("tiny", "error: model 'tiny' cannot run the chat demo: its context of 256 tokens cannot "
             "hold one chat turn"),
    ("llama3-8b", "error: model 'llama3-8b' cannot run the chat demo: random weights for 8.0B "
                  "parameters take 16.1 GB and minutes per turn on a CPU"),
    ("no/such/dir", "error: model 'no/such/dir' is neither a demo model ('small') nor a "
                    "directory"),
])
def test_models_that_cannot_run_are_refused_with_the_reason(model: str, message: str) -> None:
    proc = _demo("--model", model)
    assert proc.returncode == 2
    assert message in proc.stderr.replace("\n", " ")
    assert "hint: use 'small', or a Hugging Face checkpoint directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_readable_headers_no_turn_1_speedup_and_progress_first() -> None:
    proc = _demo("--turns", "2", "--max-tokens", "4", merge=True)
    out = proc.stdout
    assert proc.returncode == 0, out
    header = out[out.index("┏"):out.index("┡")]  # the first table's header rows
    for word in ("turn", "prompt", "tokens", "TTFT ms", "computed", "reused", "with cache",
                 "no cache", "speedup"):
        assert word in header, word
    assert "comp " not in header and "on:" not in header and "off:" not in header
    # turn 1 reuses nothing either way: its speedup cell is a dash, and a note says why
    row1 = next(line for line in out.splitlines() if line.startswith("│    1 │"))
    assert row1.rstrip().endswith("— │"), row1
    assert ("speedup = TTFT with no cache / with cache; — where nothing was reused (turn 1 "
            "computes the same tokens either way)") in out
    # progress, one line per phase, before any result
    steps = [line for line in out.splitlines() if line.startswith("[")]
    assert steps[0] == "[1/13] loading model 'small' (random weights)"
    assert steps[1] == "[2/13] with cache: warm-up"
    assert steps[-3] == "[11/13] two conversations over a host tier: turn 2, conversation B"
    assert steps[-1] == "[13/13] two workers sharing the daemon: worker 2"
    assert out.index(steps[-1]) < out.index("multi-turn chat")


def _tokens_turn_1(tok: Any) -> int:
    """Prompt tokens of turn 1 with a word-level ``tokenizers`` tokenizer (BOS id 1 prepended)."""
    return 1 + len(tok.encode(SYSTEM_PROMPT, add_special_tokens=False).ids) + len(
        tok.encode(f"\nUser: {USER_TURNS[0]}\nAssistant: ", add_special_tokens=False).ids)


def test_runs_a_save_pretrained_checkpoint_with_its_tokenizer(
    chat_ckpt: tuple[Path, Any],
) -> None:
    path, tok = chat_ckpt
    proc = _demo("--model", str(path), "--turns", "2", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    row1 = next(line for line in proc.stdout.splitlines() if line.startswith("│    1 │"))
    assert row1.split("│")[2].strip() == str(_tokens_turn_1(tok))  # not 257 byte ids
    assert f"tokenizer: {path / 'tokenizer.json'}" in proc.stdout.replace("\n", "")
    assert "reply to turn 2 (with cache): " in proc.stdout
    assert f"[1/13] loading checkpoint {path}" in proc.stderr.replace("\n", "")


def test_checkpoint_without_tokenizer_json_runs_on_byte_ids(
    tmp_path: Path, chat_ckpt: tuple[Path, Any],
) -> None:
    path = tmp_path / "no-tokenizer"
    shutil.copytree(chat_ckpt[0], path)
    (path / "tokenizer.json").unlink()
    proc = _demo("--model", str(path), "--turns", "1", "--max-tokens", "3")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.replace("\n", "")
    assert f"no tokenizer.json in {path}: prompts are UTF-8 byte ids" in out
    assert "reply to turn 1 (with cache), token ids: [" in out


def test_checkpoint_whose_context_is_too_short_is_refused(tiny_ckpt: tuple[Path, Any]) -> None:
    # no tokenizer.json: byte ids; the longest request is conversation A's last turn in the host
    # run (its system prompt ends in " [A]") with every earlier reply at its 16 tokens
    need = 1 + len(f"{SYSTEM_PROMPT} [A]".encode()) + sum(
        len(f"\nUser: {text}\nAssistant: ".encode()) for text in USER_TURNS[:2]) + 2 * 16
    proc = _demo("--model", str(tiny_ckpt[0]), "--turns", "2", "--max-tokens", "16")
    assert proc.returncode == 2
    assert (f"error: the chat needs up to {need} positions (2 turns, up to 16 new tokens each) "
            "but the model holds 256 (max_position_embeddings)") in proc.stderr.replace("\n", " ")


def test_on_a_terminal_progress_is_a_bar_that_leaves_no_lines() -> None:
    from io import StringIO

    from rich.console import Console

    from runtime.demo import run_chat_demo

    bar, tables = StringIO(), StringIO()
    run_chat_demo("small", 1, max_tokens=2, console=Console(file=tables, width=100),
                  progress=Console(file=bar, force_terminal=True, width=100))
    drawn = bar.getvalue()
    assert "two conversations over a host tier: turn 1, conversation B" in drawn
    assert "7/7" in drawn  # 1 load + 2 runs x (warm-up + 1 turn) + 2 host turns, all done
    assert "[1/7]" not in drawn  # no log lines on a terminal
    assert "multi-turn chat on small" in tables.getvalue()


def test_the_warm_up_is_turn_1_long_and_shares_no_block_with_the_chat() -> None:
    """Both engines run a warm-up as long as turn 1's prompt before turn 1 is timed, so turn 1
    costs the same with and without the cache; the warm-up must not seed the cache with a block
    of the chat."""
    from runtime.demo import _user_text, _warm_up
    from runtime.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    first = tok.encode(SYSTEM_PROMPT, add_bos=True) + tok.encode(_user_text(0))
    warm = _warm_up(tok, len(first))
    assert len(warm) == len(first)
    assert warm[:16] != first[:16]  # the first block differs: no key of the chat is stored
