"""Show the verdict: a results table, problems and advice, JSON and a plot."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Dict

from dp2ddp.source import atomic_write


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return format(v, spec or ".4g")
    return str(v)


def gpu_peaks(side: Dict[str, Any]) -> str:
    """``1234.5`` for one rank, ``1234.5 / 1230.1`` for several; ``-`` without CUDA."""
    peaks = (side.get("gpu_memory") or {}).get("peak_allocated_mib") or {}
    return " / ".join(f"{peaks[k]:.1f}" for k in sorted(peaks, key=int)) or "-"


def _pairs_line(report: Dict[str, Any]) -> str:
    pairs = report.get("pairs") or []
    if len(pairs) == 1:
        return "1 (the migration first, then the original)"
    warm = sum(p["warmup"] for p in pairs)
    short = {"original": "O", "migrated": "M"}
    order = ", ".join(" ".join(short[r] for r in p["order"]) for p in pairs[:4]) + (", ..." if len(pairs) > 4 else "")
    counted = f"{len(pairs) - warm} measured" + (f" + {warm} warm-up" if warm else "")
    return f"{counted} (order {order}); losses and replicas compared in every pair"


def summary(report: Dict[str, Any]) -> list:
    """(label, text) lines under the table: what ran, how, and what was found."""
    from dp2ddp.verify import speed

    m = report["migrated"]
    lines = [("processes", f"{m.get('nnodes', 1)} node(s) x {m.get('nproc', 1)}")]
    if report.get("threads"):
        lines.append(("threads", speed.describe_threads(report["threads"])))
    if report.get("pairs"):
        lines.append(("pairs of runs", _pairs_line(report)))
    shown = f" (pair {report['pair']})" if report.get("pair", 1) != 1 else ""
    inference = report.get("inference")
    if inference:
        noise = f", {inference['noise']} lines that vary between runs of the original not compared" if inference["noise"] else ""
        lines.append(("printed output", f"{'the original' if inference['agree'] else 'NOT the original'}'s "
                      f"{inference['lines']} line{'s' if inference['lines'] != 1 else ''} on the migration's rank 0{noise} (inference only: no optimizer step)"))
    compared = bool(report["steps_compared"])
    # no step compared (a run crashed first): nothing was found either way
    lines += [] if inference else [
        ("steps compared", _fmt(report["steps_compared"]) + shown),
        ("losses agree", f"{_fmt(report['losses_agree'])} ({report['tolerance']['rule']})" if compared
         else "not compared (no step of both runs to compare)"),
        ("max relative loss difference", _fmt(report["max_rel_loss_diff"], ".3g")),
        ("replicas in sync", _fmt(report["replicas_in_sync"]) if report.get("replicas_compared", True)
         else "not compared (a rank of the migrated run reported no parameters: it did not finish)"),
    ]
    sp = report.get("speed")
    if sp:
        judgement = sp.get("judgement") or ""
        req = f"required {report['min_speedup']:g}"
        if not report["min_speedup"]:
            req = "not judged: --min-speedup 0" if judgement.startswith("ignored") else f"not judged ({judgement})"
        lines.append(("speed-up", f"{speed.describe(sp)}; {req}"))
    else:
        lines.append(("speed-up", f"{_fmt(report['speedup'], '.2f')} (required {report['min_speedup']:g})"))
    from dp2ddp.verify import partition

    for loader in (report.get("data") or {}).get("loaders") or []:
        lines.append(("data", partition.summary(loader)))
    if report.get("outputs"):
        lines.append(("outputs", report["outputs"]["summary"]))
    return lines


def show(report: Dict[str, Any], stream=None) -> None:
    stream = stream or sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")
    o, m = report["original"], report["migrated"]
    several = sum(not p["warmup"] for p in report.get("pairs", [])) > 1
    med = ", median" if several else ""
    rows = [
        ("optimizer steps", _fmt(o["steps"]), _fmt(m["steps"])),
        (f"samples/s (steady{med})", _fmt(o["samples_per_s"], ".1f"), _fmt(m["samples_per_s"], ".1f")),
        (f"wall time (s{med})", _fmt(o["wall_s"], ".1f"), _fmt(m["wall_s"], ".1f")),
        ("exit code", "hung" if o.get("hung") else _fmt(o["exit_code"]), "hung" if m.get("hung") else _fmt(m["exit_code"])),
    ]
    if o.get("gpu_memory") or m.get("gpu_memory"):
        rows.insert(3, ("peak GPU memory (MiB, per rank)", gpu_peaks(o), gpu_peaks(m)))
    lines = summary(report)
    verdict = report["verdict"].upper()
    warnings = report.get("warnings", [])
    if tty:
        from rich.console import Console
        from rich.table import Table

        console = Console(file=stream)
        t = Table(title="dp2ddp verify")
        t.add_column("")
        t.add_column("original (python)", justify="right")
        t.add_column("migrated (torchrun)", justify="right")
        for r in rows:
            t.add_row(*r)
        console.print(t)
        for k, v in lines:
            console.print(f"  {k}: {v}", highlight=False, markup=False)
        for n in report["notes"]:
            console.print(f"  note: {n}", style="dim", highlight=False, markup=False)
        for w in warnings:
            console.print(f"  {'warning: ' if not w.startswith('  ') else ''}{w}", style="cyan", highlight=False, markup=False)
        for p in report["problems"]:
            console.print(f"  {p}", style="yellow", highlight=False, markup=False)
        console.print(f"verdict: {verdict}", style="bold green" if verdict == "PASS" else "bold red")
        return
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows + [("", "original", "")])
    out = [f"{'':<{w0}}  {'original':>{w1}}  migrated"]
    out += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    out += [f"{k}: {v}" for k, v in lines]
    out += [f"note: {n}" for n in report["notes"]]
    out += [w if w.startswith("  ") else f"warning: {w}" for w in warnings]
    out += [p for p in report["problems"]]
    out.append(f"verdict: {verdict}")
    stream.write("\n".join(out) + "\n")
    stream.flush()


def write_json(report: Dict[str, Any], path: str) -> None:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    data = json.dumps(clean(report), indent=2, allow_nan=False) + "\n"
    if path == "-":
        sys.stdout.write(data)
    else:
        atomic_write(path, data.encode())


def caption(report: Dict[str, Any], width: int = 150) -> str:
    """The plot's caption: threads, speed, outputs and what differs in them."""
    import textwrap

    from dp2ddp.verify import speed

    parts = []
    if report.get("threads"):
        parts.append("threads: " + speed.describe_threads(report["threads"]))
    o, m = report.get("original") or {}, report.get("migrated") or {}
    if o.get("gpu_memory") or m.get("gpu_memory"):
        device = (m.get("gpu_memory") or o.get("gpu_memory") or {}).get("device") or "GPU"
        parts.append(f"peak GPU memory ({device}, MiB per rank): original {gpu_peaks(o)}, migrated {gpu_peaks(m)}")
    if report.get("speed"):
        parts.append("speed-up: " + speed.describe(report["speed"]))
    own = [p for p in report.get("problems", []) if not p.startswith(("outputs:", "  "))]
    for p in own[:4]:  # the losses, the data, crashes: each with its line where the probe knew it
        parts.append(f"problem: {p}")
    if len(own) > 4:
        parts.append(f"... and {len(own) - 4} more problems (see the JSON report)")
    outs = report.get("outputs")
    if outs:
        parts.append("outputs: " + outs["summary"])
        for d in outs["differences"][:4]:
            parts.append(f"{d['severity']}: {d['message']}; advice: {d['advice']}")
        if len(outs["differences"]) > 4:
            parts.append(f"... and {len(outs['differences']) - 4} more (see the JSON report)")
    lines = []
    for p in parts:
        lines.extend(textwrap.wrap(p, width, subsequent_indent="    ") or [""])
    return "\n".join(lines)


def plot(report: Dict[str, Any], path: str) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = caption(report)
    n_lines = text.count("\n") + 1 if text else 0
    height = 4.6 + 0.15 * n_lines  # inches: the plots, then the caption below them
    fig = plt.figure(figsize=(15, height))
    grid = fig.add_gridspec(1, 3, bottom=(0.15 * n_lines + 0.8) / height, top=1 - 0.75 / height, wspace=0.28)
    ax1, ax2, ax3 = (fig.add_subplot(grid[0, i]) for i in range(3))
    colours = {"original": "C0", "migrated": "C1"}
    for key, style in (("original", "-"), ("migrated", "--")):
        ys = report["losses"][key]
        xs = [i + 1 for i, y in enumerate(ys) if y is not None]
        ax1.plot(xs, [y for y in ys if y is not None], style, color=colours[key], label=key)
    ax1.set_title(f"loss per step, pair {report.get('pair', 1)} (max rel. diff {_fmt(report['max_rel_loss_diff'], '.2g')})", fontsize=10)
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss (global mean)")
    ax1.legend()

    runs = report.get("runs") or [
        {"pair": 1, "role": k, "warmup": False, "throughput": report["throughput"][k]} for k in ("original", "migrated")
    ]
    labelled = set()
    for r in runs:
        rs = r["throughput"] or []
        xs = [i + 1 for i, v in enumerate(rs) if v is not None]
        label = r["role"] if r["role"] not in labelled else None
        labelled.add(r["role"])
        ax2.plot(xs, [v for v in rs if v is not None], ":" if r["warmup"] else "-", color=colours[r["role"]],
                 alpha=0.45 if r["warmup"] else 0.8, linewidth=1, label=label)
    ax2.set_title("throughput per step, every run (dotted: warm-up)", fontsize=10)
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("samples/s")
    ax2.legend()

    sp = report.get("speed") or {}
    pairs = report.get("pairs") or [{"pair": 1, "warmup": False, "speedup": report["speedup"]}]
    for p in pairs:
        if p["speedup"] is None:
            continue
        ax3.plot([p["pair"]], [p["speedup"]], "o", color="C2", fillstyle="none" if p["warmup"] else "full")
    if sp.get("ci"):
        ax3.axhspan(sp["ci"][0], sp["ci"][1], color="C2", alpha=0.15, label=f"{sp['confidence']:.0%} interval")
    if sp.get("median"):
        ax3.axhline(sp["median"], color="C2", linewidth=1, label=f"median {sp['median']:.2f}")
    ax3.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    if report.get("min_speedup"):
        ax3.axhline(report["min_speedup"], color="C3", linestyle=":", linewidth=1, label=f"--min-speedup {report['min_speedup']:g}")
    ax3.set_xticks([p["pair"] for p in pairs])
    ax3.set_title(f"speed-up per pair (hollow: warm-up): {sp.get('verdict', _fmt(report['speedup'], '.2f'))}", fontsize=10)
    ax3.set_xlabel("pair of runs")
    ax3.set_ylabel("migrated / original samples/s")
    ax3.legend(fontsize=8)
    fig.suptitle(f"dp2ddp verify: {report['verdict']}", y=1 - 0.12 / height)
    if text:
        fig.text(0.01, 0.1 / height, text, fontsize=8, va="bottom", ha="left", family="monospace")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, buf.getvalue())
