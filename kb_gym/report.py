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
    """Two decimals from 1x up, three significant digits below (0.002x, not 0.00x)."""
    if not (isinstance(value, int | float) and math.isfinite(value)):
        return "-"
    return f"{value:.2f}x" if value >= 0.995 else f"{value:.3g}x"


GEOMEAN_NOTE = "geomean(best): geometric-mean speedup over the tasks whose best sample is correct"


def _at_k_columns(summary: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``fast_1@k`` columns the summary holds (fast_p@k at p = 1), ordered by k."""
    keys = {key for row in summary.values() for key in row if key.startswith("fast_1@")}
    return sorted(keys, key=lambda key: int(key.split("@")[1]))


def format_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`kb_gym.metrics.summarize` output.

    Rows: each level, then ``all``. Columns: ``n`` (tasks), ``samples`` (only when some task has
    several, then also ``best:correct`` and ``best:fast_1``, each task's best sample), ``correct``,
    ``fast_0`` ... ``fast_2`` (whatever p the summary holds), ``fast_1@k`` for each k summarised,
    ``geomean(best)`` (labelled below the table), and ``sol`` (median share of the speed-of-light
    floor) when any result reports one.
    """
    return format_tables({"": summary})


def format_tables(summaries: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """One table over several runs (a ``run`` column first, e.g. base against trained): each run's rows."""
    runs = [name for name in summaries if name]
    merged = [row for summary in summaries.values() for row in summary.values()]
    every = {name: row for summary in summaries.values() for name, row in summary.items()}
    fast_cols = _fast_columns(every)
    at_k = _at_k_columns(every)
    show_samples = any(row.get("n_samples", 0) != row.get("n_tasks", 0) for row in merged)
    show_sol = any(row.get("median_sol_fraction") is not None for row in merged)
    header = ((["run"] if runs else []) + ["level", "n"] + (["samples"] if show_samples else [])
              + ["correct", *fast_cols, *at_k] + (["best:correct", "best:fast_1"] if show_samples else [])
              + ["geomean(best)"] + (["sol"] if show_sol else []))
    rows = []
    for run, summary in summaries.items():
        for name, row in summary.items():
            cells = ([run] if runs else []) + [str(name), str(row.get("n_tasks", 0))]
            if show_samples:
                cells.append(str(row.get("n_samples", 0)))
            cells.append(_fmt_rate(row.get("correct")))
            cells.extend(_fmt_rate(row.get(col)) for col in [*fast_cols, *at_k])
            if show_samples:
                best = row.get("best_of") or {}
                cells += [_fmt_rate(best.get("correct")), _fmt_rate(best.get("fast_1"))]
            cells.append(_fmt_speedup(row.get("geomean_speedup")))
            if show_sol:
                sol = row.get("median_sol_fraction")
                cells.append(f"{sol:.0%}" if isinstance(sol, int | float) else "-")
            rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    text_cols = 2 if runs else 1

    def line(cells: Sequence[str]) -> str:
        first = [c.ljust(w) for c, w in zip(cells[:text_cols], widths[:text_cols], strict=True)]
        rest = (c.rjust(w) for c, w in zip(cells[text_cols:], widths[text_cols:], strict=True))
        return "  ".join([*first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows), GEOMEAN_NOTE])


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
    fig, ax = _new_plot()

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

    return _finish_plot(fig, ax, title, path_png)


def _new_plot() -> tuple[Any, Any]:
    """A figure on matplotlib's Agg canvas directly: no GUI, no global backend switch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _finish_plot(fig: Any, ax: Any, title: str, path_png: str | Path) -> Path:
    """The axes every fast_p plot shares (p = 1 marked), then the PNG."""
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


def plot_runs(runs: Mapping[str, Iterable[Any]], path_png: str | Path, *, title: str = "fast_p") -> Path:
    """fast_p against p over all tasks, one curve per run (base against trained), in one PNG."""
    fig, ax = _new_plot()
    ps = [PLOT_PS_MAX * i / (PLOT_STEPS - 1) for i in range(PLOT_STEPS)]
    for name, results in runs.items():
        row = summarize(list(results), ps=ps)[ALL]
        ax.plot(ps, [row[fast_key(p)] for p in ps], drawstyle="steps-post", linewidth=1.8,
                label=f"{name} (n={row['n_tasks']}, fast_1 {row[fast_key(1.0)]:.2f})")
    return _finish_plot(fig, ax, title, path_png)


def report(
    results_path: str | Path | Sequence[str | Path],
    png_path: str | Path | None = None,
    *,
    ps: Sequence[float] = DEFAULT_PS,
    tasks: Iterable[str] | None = None,
    ks: Sequence[int] = (),
) -> str:
    """Load one JSONL results file (or several: one table and one plot comparing the runs, named by file),
    summarise and return the table (and write the plot if asked)."""
    paths = [results_path] if isinstance(results_path, str | Path) else list(results_path)
    loaded: dict[str, LoadedResults] = {}
    for path in paths:
        name = Path(path).name if len(paths) == 1 else _run_name(Path(path), paths)
        loaded[name] = load_results(path)
    task_list = None if tasks is None else list(tasks)
    summaries = {name: summarize(results, ps=ps, tasks=task_list, ks=ks) for name, results in loaded.items()}
    table = format_table(next(iter(summaries.values()))) if len(paths) == 1 else format_tables(summaries)
    notes = [f"skipped {r.n_corrupt} corrupt line(s) of {r.path}" for r in loaded.values() if r.n_corrupt]
    if png_path is not None:
        if len(paths) == 1:
            plot_fast_p(next(iter(loaded.values())), png_path, title=f"fast_p: {Path(paths[0]).name}")
        else:
            plot_runs(loaded, png_path, title="fast_p: " + " vs ".join(loaded))
        notes.append(f"plot written to {png_path}")
    return table + "".join(f"\n({note})" for note in notes)


def _run_name(path: Path, paths: Sequence[str | Path]) -> str:
    """A run's label: its file name, or its folder's where the file names are the same (eval/base/results.jsonl)."""
    names = [Path(p).name for p in paths]
    return (path.parent.name or str(path)) if names.count(path.name) > 1 else path.name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kb_gym.report", description=__doc__)
    parser.add_argument("results", nargs="+", help="JSONL results file(s); several: one table and plot comparing them")
    parser.add_argument("--k", default="", help="comma-separated k for fast_p@k columns, e.g. 1,4")
    parser.add_argument("--png", default=None, help="write the fast_p curve here")
    parser.add_argument(
        "--ps", default=",".join(f"{p:g}" for p in DEFAULT_PS), help="comma-separated p values"
    )
    args = parser.parse_args(argv)
    ps = [float(p) for p in args.ps.split(",") if p.strip()]
    print(report(args.results, args.png, ps=ps, ks=[int(k) for k in args.k.split(",") if k.strip()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
