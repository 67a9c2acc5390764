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


def show(report: Dict[str, Any], stream=None) -> None:
    stream = stream or sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")
    o, m = report["original"], report["migrated"]
    rows = [
        ("optimizer steps", _fmt(o["steps"]), _fmt(m["steps"])),
        ("samples/s (steady)", _fmt(o["samples_per_s"], ".1f"), _fmt(m["samples_per_s"], ".1f")),
        ("wall time (s)", _fmt(o["wall_s"], ".1f"), _fmt(m["wall_s"], ".1f")),
        ("exit code", "hung" if o.get("hung") else _fmt(o["exit_code"]), "hung" if m.get("hung") else _fmt(m["exit_code"])),
    ]
    summary = [
        ("processes", f"{m.get('nnodes', 1)} node(s) x {m.get('nproc', 1)}"),
        ("steps compared", _fmt(report["steps_compared"])),
        ("losses agree", f"{_fmt(report['losses_agree'])} ({report['tolerance']['rule']})"),
        ("max relative loss difference", _fmt(report["max_rel_loss_diff"], ".3g")),
        ("replicas in sync", _fmt(report["replicas_in_sync"])),
        ("speed-up", f"{_fmt(report['speedup'], '.2f')} (required {report['min_speedup']:g})"),
    ]
    verdict = report["verdict"].upper()
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
        for k, v in summary:
            console.print(f"  {k}: {v}", highlight=False)
        for n in report["notes"]:
            console.print(f"  note: {n}", style="dim", highlight=False)
        for p in report["problems"]:
            console.print(f"  {p}", style="yellow", highlight=False, markup=False)
        console.print(f"verdict: {verdict}", style="bold green" if verdict == "PASS" else "bold red")
        return
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows + [("", "original", "")])
    lines = [f"{'':<{w0}}  {'original':>{w1}}  migrated"]
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    lines += [f"{k}: {v}" for k, v in summary]
    lines += [f"note: {n}" for n in report["notes"]]
    lines += [p for p in report["problems"]]
    lines.append(f"verdict: {verdict}")
    stream.write("\n".join(lines) + "\n")
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


def plot(report: Dict[str, Any], path: str) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("original", "-"), ("migrated", "--")):
        ys = report["losses"][key]
        xs = [i + 1 for i, y in enumerate(ys) if y is not None]
        ax1.plot(xs, [y for y in ys if y is not None], style, label=key)
        rs = report["throughput"][key]
        xs = [i + 1 for i, r in enumerate(rs) if r is not None]
        ax2.plot(xs, [r for r in rs if r is not None], style, label=key)
    ax1.set_title(f"loss per step (max rel. diff {_fmt(report['max_rel_loss_diff'], '.2g')})")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss (global mean)")
    ax1.legend()
    ax2.set_title(f"throughput (speed-up {_fmt(report['speedup'], '.2f')})")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("samples/s")
    ax2.legend()
    fig.suptitle(f"dp2ddp verify: {report['verdict']}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, buf.getvalue())
