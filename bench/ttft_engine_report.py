"""The engine-level results of ``bench.ttft`` as measurement lines, footer notes and headline
verdicts against the targets (BENCHMARKS.md, "bench.ttft" rows).
"""

from __future__ import annotations

from bench.common import Measurement, measurement
from bench.ttft_engine_setup import Plan

BENCH = "ttft"

# Targets (BENCHMARKS.md, "bench.ttft" rows).
TARGET_SPEEDUP_32K = 12.0  # host hit vs recompute, GPU, 32K tokens
TARGET_FLOOR = 1 / 1.25  # host hit <= 1.25 x (PCIe floor + suffix compute)
TARGET_OVERLAP = 1 / 1.1  # layer-wise host hit <= 1.1 x max(load, compute)
TARGET_NO_REUSE = 0.98  # <= 2 % overhead with the store attached and nothing found
TARGET_DAEMON = 0.9  # the daemon's host-hit speedup >= 0.9 x the in-process connector's
TARGET_FIRST_HIT = 1 / 1.5  # the first hbm hit after start <= 1.5 x a steady hbm hit


def _lines(results: dict[int, dict[str, float]], name: str, plan: Plan,
           model_cold_ms: dict[int, float]) -> list[Measurement]:
    lines: list[Measurement] = []
    for n, r in results.items():
        case = f"{name}/{n}-tokens"
        ms = {k: v * 1e3 for k, v in r.items() if k != "floor_bw"}

        def ttft(variant: str, value: float, baseline: str | None = None,
                 base: float | None = None, metric: str = "ttft", case: str = case) -> None:
            lines.append(measurement(BENCH, case, variant, metric, value, "ms", baseline=baseline,
                                     baseline_value=base, higher_is_better=False))

        cold = ms["cold"]
        bound = max(ms["load"], ms["hbm"])
        ttft("engine cold", cold, "cold prefill (model forward)", model_cold_ms.get(n))
        ttft("engine hbm hit", ms["hbm"], "engine cold (recompute)", cold)
        ttft("host hit", ms["host"], "engine cold (recompute)", cold)
        if "floor" in ms:
            ttft("host hit (vs PCIe floor)", ms["host"], "PCIe floor + engine hbm hit",
                 ms["floor"] + ms["hbm"])
        ttft("host hit, layer-wise", ms["host"], "max(load only, engine hbm hit)", bound)
        ttft("host hit, load-then-compute", ms["host_ltc"], "max(load only, engine hbm hit)",
             bound)
        ttft("host hit, layer-wise (vs its copies)", ms["host"],
             "max(load only layers 1.., engine hbm hit)", max(ms["load_hit"], ms["hbm"]))
        if "floor" in ms:
            ttft("load only", ms["load"], "PCIe floor", ms["floor"], metric="time")
            ttft("PCIe floor", ms["floor"], metric="time")
            lines.append(measurement(BENCH, case, "PCIe H2D pinned copy", "bandwidth",
                                     r["floor_bw"] / 1e9, "GB/s"))
        else:
            ttft("load only", ms["load"], metric="time")
        ttft("load only, layers 1..", ms["load_hit"], "load only", ms["load"], metric="time")
        for kind in ("disk", "redis"):
            if kind in ms:
                ttft(f"{kind} hit", ms[kind], "engine cold (recompute)", cold)
        if "daemon" in ms:  # ratio: the daemon's speedup over recompute / the in-process one's
            ttft("daemon host hit", ms["daemon"], "host hit (in-process connector)", ms["host"])
        ttft("no reuse, with store", ms["noreuse_with"], "no store (same runtime)",
             ms["noreuse_without"])
        ttft("no reuse, without store", ms["noreuse_without"])
    return lines


def _no_reuse_notes(results: dict[int, dict[str, float]], count: int) -> list[str]:
    return [
        f"no reuse at {n} tokens: total {r['noreuse_with_total'] * 1e3:.1f} ms with the store, "
        f"{r['noreuse_without_total'] * 1e3:.1f} ms without ({count} unique prompts each, "
        "interleaved; saves not waited for between prompts)"
        for n, r in results.items()
    ]


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _headline(results: dict[int, dict[str, float]], plan: Plan) -> list[str]:
    if not results:
        return []
    out: list[str] = []
    nmax = max(results)
    r = results[nmax]
    speedup = r["cold"] / r["host"]
    if plan.gpu and nmax == 32768:
        out.append(f"host hit at {nmax} tokens: {speedup:.1f}x faster than recompute "
                   f"(target >= {TARGET_SPEEDUP_32K:g}: {_verdict(speedup >= TARGET_SPEEDUP_32K)})")
    else:
        out.append(f"host hit at {nmax} tokens: {speedup:.1f}x faster than recompute "
                   f"(the >= {TARGET_SPEEDUP_32K:g}x target is for the GPU at 32K tokens)")
    if "floor" in r:
        fr = (r["floor"] + r["hbm"]) / r["host"]
        out.append(f"host hit at {nmax} tokens vs PCIe floor + compute: ratio {fr:.3f} "
                   f"(target >= {TARGET_FLOOR:.2f}: {_verdict(fr >= TARGET_FLOOR)})")
    lw = {n: max(x["load"], x["hbm"]) / x["host"] for n, x in results.items()}
    ltc = {n: max(x["load"], x["hbm"]) / x["host_ltc"] for n, x in results.items()}
    worst = min(lw, key=lw.__getitem__)
    own = {n: max(x["load_hit"], x["hbm"]) / x["host"] for n, x in results.items()}
    out.append(f"overlap: layer-wise host hit vs max(load, compute), worst {lw[worst]:.3f} at "
               f"{worst} tokens (target >= {TARGET_OVERLAP:.3f}: "
               f"{_verdict(lw[worst] >= TARGET_OVERLAP)}); load-then-compute "
               f"{ltc[worst]:.3f} there; against the copies the hit makes (layers 1.., its "
               f"engine writes layer 0 from the tokens) {own[worst]:.3f}")
    dm = {n: x["host"] / x["daemon"] for n, x in results.items() if "daemon" in x}
    if dm:
        n = max(dm)
        out.append(f"daemon host hit at {n} tokens: {dm[n]:.3f} x the in-process connector's "
                   f"speedup (target >= {TARGET_DAEMON}: {_verdict(dm[n] >= TARGET_DAEMON)})")
    nr = {n: x["noreuse_without"] / x["noreuse_with"] for n, x in results.items()}
    worst = min(nr, key=nr.__getitem__)
    out.append(f"no reuse: without store / with store, worst {nr[worst]:.3f} at {worst} tokens "
               f"(target >= {TARGET_NO_REUSE}: {_verdict(nr[worst] >= TARGET_NO_REUSE)})")
    return out
