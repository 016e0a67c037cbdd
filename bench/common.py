"""What every benchmark in ``bench/`` shares: the measurement line, its JSON and table output,
the machine description and the recorded-results file.

The output convention is ``/work/shared/BENCHMARKS.md`` ("Output convention"): with ``--json``
one JSON object per measurement and line, with exactly the fields of :class:`Measurement`;
otherwise a small table ending with the headline ratio. ``--record`` writes
``bench/results/<bench>-<machine>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """One measurement line. ``ratio`` is oriented so that higher is better and 1.0 means "as
    good as the baseline"; the three baseline fields are all None when there is no baseline."""

    bench: str
    case: str
    variant: str
    metric: str
    value: float
    unit: str
    baseline: str | None
    baseline_value: float | None
    ratio: float | None
    machine: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def measurement(
    bench: str,
    case: str,
    variant: str,
    metric: str,
    value: float,
    unit: str,
    *,
    baseline: str | None = None,
    baseline_value: float | None = None,
    higher_is_better: bool = True,
) -> Measurement:
    """Build a line and its ratio: value/baseline_value when higher is better (throughputs, hit
    ratios), baseline_value/value when lower is better (times). The ratio is None without a
    baseline, and when its divisor is 0 (JSON has no infinity)."""
    ratio: float | None = None
    if baseline is not None and baseline_value is not None:
        num, den = (value, baseline_value) if higher_is_better else (baseline_value, value)
        ratio = num / den if den else None
    else:
        baseline = baseline_value = None
    return Measurement(
        bench, case, variant, metric, value, unit, baseline, baseline_value, ratio, machine_slug()
    )


def median_time(fn: Callable[[], object], device: Any, runs: int) -> float:
    """Median seconds of ``runs`` calls of ``fn`` after one warm-up call (kernels, allocator,
    compiled graphs), CUDA-synchronised around each call when ``device`` is a GPU."""
    def sync() -> None:
        if getattr(device, "type", None) == "cuda":
            import torch

            torch.cuda.synchronize()

    fn()
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_model_config(name: str, *, gpu: bool, positions: int) -> Any:
    """The model config a runtime bench runs: ``name`` (fp32 on the CPU, where the HF parity
    checks are exact enough), with room for at least ``positions`` positions."""
    from runtime import get_model_config  # noqa: PLC0415 - torch: only the runtime benches

    cfg = get_model_config(name)
    if not gpu:
        cfg = cfg.with_dtype("float32")
    return dataclasses.replace(
        cfg, max_position_embeddings=max(cfg.max_position_embeddings, positions))


def add_standard_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--quick``, ``--json`` and ``--record``, as every bench takes them."""
    parser.add_argument("--quick", action="store_true", help="small run (< 1 min on 2 cores)")
    parser.add_argument("--json", action="store_true", help="one JSON object per measurement")
    parser.add_argument(
        "--record", action="store_true", help="write bench/results/<bench>-<machine>.json"
    )
    return parser


def emit_json(lines: Iterable[Measurement], out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    for line in lines:
        print(line.to_json(), file=out)


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str = "",
    footer: Sequence[str] = (),
    headline: str = "",
    out: TextIO | None = None,
) -> None:
    """A plain aligned table; floats to 4 significant digits; then the ``footer`` lines and the
    ``headline``, which comes last."""
    out = sys.stdout if out is None else out
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if title:
        print(title, file=out)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)
    if footer:
        print(file=out)
        for line in footer:
            print(line, file=out)
    if headline:
        print(file=out)
        print(headline, file=out)


def print_measurements(lines: Sequence[Measurement], unit: str, *, title: str = "",
                       headline: str = "", out: TextIO | None = None) -> None:
    """:func:`print_table` of measurement lines, one row each: case, variant, value, baseline,
    the baseline's value and the ratio (``unit`` heads the value columns)."""
    print_table(("case", "variant", unit, "baseline", f"baseline {unit}", "ratio"),
                [(x.case, x.variant, x.value, x.baseline, x.baseline_value, x.ratio)
                 for x in lines], title=title, headline=headline, out=out)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@lru_cache(maxsize=1)
def machine_description() -> dict[str, Any]:
    """CPU model and cores, GPU name and count (via torch.cuda when torch is importable),
    torch and Python versions. torch is imported here only, and its absence is fine."""
    desc: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count() or 0,
        "gpu": None,
        "gpu_count": 0,
        "torch": None,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import torch  # noqa: PLC0415 - optional and slow to import

        desc["torch"] = torch.__version__
        if torch.cuda.is_available():
            desc["gpu_count"] = torch.cuda.device_count()
            desc["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no torch, or a broken CUDA setup: describe what we can
        pass
    return desc


@lru_cache(maxsize=1)
def machine_slug() -> str:
    """A short name for file names and the ``machine`` field: ``h200`` (``h200-x4`` with four
    GPUs) on a GPU machine, else ``cpu-<cores>core``."""
    desc = machine_description()
    if desc["gpu"]:
        words = re.findall(r"[a-z0-9]+", desc["gpu"].lower())
        words = [w for w in words if w not in {"nvidia", "geforce", "tesla", "amd", "radeon"}]
        slug = (words[0] if words else "gpu")
        return slug if desc["gpu_count"] <= 1 else f"{slug}-x{desc['gpu_count']}"
    return f"cpu-{desc['cpu_cores']}core"


def git_commit() -> str | None:
    """HEAD, or ``KVSTORE_GIT_COMMIT`` where the checkout's history is not the tree's (the GPU
    machine runs a copy of the working tree: scripts/gpu.sh passes the commit along)."""
    pinned = os.environ.get("KVSTORE_GIT_COMMIT", "").strip()
    if pinned:
        return pinned
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def record(
    bench_name: str,
    lines: Sequence[Measurement],
    command: str,
    *,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``bench/results/<bench>-<machine>.json`` (date, git commit, machine description, the
    exact command, the measurement lines and optional ``extra`` notes); return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{bench_name}-{machine_slug()}.json"
    doc: dict[str, Any] = {
        "bench": bench_name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine_slug(),
        "machine_description": machine_description(),
        "command": command,
        "measurements": [dataclasses.asdict(m) for m in lines],
    }
    if extra:
        doc["notes"] = extra
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def command_line() -> str:
    """The command that is running, as a user would retype it."""
    argv = sys.argv[:]
    if argv and argv[0].endswith(".py"):
        mod = Path(argv[0]).resolve()
        try:
            rel = mod.relative_to(REPO_ROOT).with_suffix("")
            return " ".join(["python", "-m", ".".join(rel.parts), *argv[1:]])
        except ValueError:
            pass
    return " ".join(["python", *argv])
