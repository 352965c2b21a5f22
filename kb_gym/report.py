"""Plain-text tables and fast_p plots of evaluation results.

``python -m kb_gym.report results.jsonl [--png fast_p.png]`` prints the table (and writes the plot).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kb_gym.metrics import ALL, DEFAULT_PS, LoadedResults, fast_key, load_results, summarize

PLOT_PS_MAX = 3.0
PLOT_STEPS = 301


def _is_summary(obj: Any) -> bool:
    return isinstance(obj, Mapping) and ALL in obj and isinstance(obj[ALL], Mapping) and "n_tasks" in obj[ALL]


def _fast_columns(summary: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The ``fast_*`` keys of a summary, ordered by p."""
    keys: dict[str, float] = {}
    for row in summary.values():
        for key in row:
            if key.startswith("fast_"):
                try:
                    keys[key] = float(key[len("fast_") :])
                except ValueError:
                    continue
    return sorted(keys, key=keys.__getitem__)


def _fmt_rate(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) and math.isfinite(value) else "-"


def _fmt_speedup(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, int | float) and math.isfinite(value) else "-"


def format_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`kb_gym.metrics.summarize` output.

    Rows: each level, then ``all``. Columns: ``n`` (tasks), ``samples`` (only when some task has
    several), ``correct``, ``fast_0`` ... ``fast_2`` (whatever p the summary holds), ``geomean``, and
    ``sol`` (median share of the speed-of-light floor) when any result reports one.
    """
    fast_cols = _fast_columns(summary)
    show_samples = any(row.get("n_samples", 0) != row.get("n_tasks", 0) for row in summary.values())
    show_sol = any(row.get("median_sol_fraction") is not None for row in summary.values())
    header = (["level", "n"] + (["samples"] if show_samples else []) + ["correct", *fast_cols, "geomean"]
              + (["sol"] if show_sol else []))
    rows = []
    for name, row in summary.items():
        cells = [str(name), str(row.get("n_tasks", 0))]
        if show_samples:
            cells.append(str(row.get("n_samples", 0)))
        cells.append(_fmt_rate(row.get("correct")))
        cells.extend(_fmt_rate(row.get(col)) for col in fast_cols)
        cells.append(_fmt_speedup(row.get("geomean_speedup")))
        if show_sol:
            sol = row.get("median_sol_fraction")
            cells.append(f"{sol:.0%}" if isinstance(sol, int | float) else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def plot_fast_p(
    results_or_summary: Iterable[Any] | Mapping[str, Any] | str | Path,
    path_png: str | Path,
    *,
    title: str = "fast_p",
) -> Path:
    """Plot fast_p against p per level (and overall) and save it as a PNG.

    Given results (EvalResult objects, dicts, or a JSONL path) the curve is computed on p from 0 to
    3 in steps of 0.01; given a summary only its own p values can be drawn (as points on lines).
    Uses matplotlib's Agg canvas directly, so no GUI and no global backend switch.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)

    if isinstance(results_or_summary, str | Path):
        results_or_summary = load_results(results_or_summary)
    if _is_summary(results_or_summary):
        summary = results_or_summary
        cols = _fast_columns(summary)
        ps = [float(c[len("fast_") :]) for c in cols]
        for name, row in summary.items():
            ys = [row.get(c, 0.0) or 0.0 for c in cols]
            ax.plot(ps, ys, marker="o", label=f"{name} (n={row.get('n_tasks', 0)})", **_style(name))
    else:
        results = list(results_or_summary)
        ps = [PLOT_PS_MAX * i / (PLOT_STEPS - 1) for i in range(PLOT_STEPS)]
        summary = summarize(results, ps=ps)
        for name, row in summary.items():
            ys = [row[fast_key(p)] for p in ps]
            ax.plot(ps, ys, drawstyle="steps-post", label=f"{name} (n={row['n_tasks']})", **_style(name))

    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlim(left=0.0)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("p (speedup threshold)")
    ax.set_ylabel("fast_p (fraction of tasks)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right")
    path = Path(path_png)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
    return path


def _style(name: str) -> dict[str, Any]:
    return {"color": "black", "linewidth": 2.0} if name == ALL else {"linewidth": 1.3}


def report(
    results_path: str | Path,
    png_path: str | Path | None = None,
    *,
    ps: Sequence[float] = DEFAULT_PS,
    tasks: Iterable[str] | None = None,
) -> str:
    """Load a JSONL results file, summarise it and return the table (and write the plot if asked)."""
    results: LoadedResults = load_results(results_path)
    task_list = None if tasks is None else list(tasks)
    table = format_table(summarize(results, ps=ps, tasks=task_list))
    notes = []
    if results.n_corrupt:
        notes.append(f"skipped {results.n_corrupt} corrupt line(s) of {results_path}")
    if png_path is not None:
        plot_fast_p(results, png_path, title=f"fast_p: {Path(results_path).name}")
        notes.append(f"plot written to {png_path}")
    return table + "".join(f"\n({note})" for note in notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kb_gym.report", description=__doc__)
    parser.add_argument("results", help="JSONL results file (one EvalResult per line)")
    parser.add_argument("--png", default=None, help="write the fast_p curve here")
    parser.add_argument(
        "--ps", default=",".join(f"{p:g}" for p in DEFAULT_PS), help="comma-separated p values"
    )
    args = parser.parse_args(argv)
    ps = [float(p) for p in args.ps.split(",") if p.strip()]
    print(report(args.results, args.png, ps=ps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
