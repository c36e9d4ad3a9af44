"""Print a scenario's table and write its JSON and PNG chart under bench-results/."""

import json
from pathlib import Path
from typing import Any

from .stats import Outcome


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table: the same text reads in a terminal and pastes into docs/performance.md."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    out = [line(columns), "| " + " | ".join("-" * w for w in widths) + " |"]
    return "\n".join(out + [line(r) for r in cells])


def render(outcome: Outcome, meta: dict[str, Any]) -> str:
    lines = [f"## {outcome.scenario} ({meta['scale']}, {meta['mode']}, {meta['event_loop']})", ""]
    lines.append(table(outcome.columns, outcome.rows))
    if outcome.targets:
        lines += [
            "",
            table(
                ["target", "value", "limit", "met"],
                [
                    [
                        t.name,
                        t.value,
                        t.as_dict()["target"],
                        {True: "yes", False: "NO"}.get(t.met, "–"),
                    ]
                    for t in outcome.targets
                ],
            ),
        ]
    rss = ", ".join(f"{k} {v:.0f} MB" for k, v in meta["peak_rss_mb"].items() if v is not None)
    load = meta.get("load_avg_1m", ["?", "?"])
    host = f"{meta.get('cpus')} CPUs ({meta.get('cpu_model')})"
    lines += [
        "",
        f"{meta.get('date')}, commit {meta.get('commit')}"
        + (" with uncommitted changes" if meta.get("dirty") else ""),
        f"peak RSS: {rss}; host: {host}, load {load[0]} → {load[1]}",
    ] + [f"note: {n}" for n in outcome.notes]
    return "\n".join(lines)


def write(outcome: Outcome, meta: dict[str, Any], results: Path) -> dict[str, Path]:
    results.mkdir(parents=True, exist_ok=True)
    document = {
        "scenario": outcome.scenario,
        **meta,
        "table": {"columns": outcome.columns, "rows": outcome.rows},
        "targets": [t.as_dict() for t in outcome.targets],
        "notes": outcome.notes,
        "data": outcome.data,
    }
    json_path = results / f"{outcome.scenario}.json"
    json_path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    png_path = results / f"{outcome.scenario}.png"
    return {"json": json_path, "png": png_path if chart(outcome, meta, png_path) else None}


def chart(outcome: Outcome, meta: dict[str, Any], path: Path) -> bool:
    """Draw the PNG; False when matplotlib (the `bench` extra) is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = outcome.panels or [{"kind": "text", "title": outcome.scenario}]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        draw(ax, panel)
    fig.suptitle(f"{outcome.scenario} — {meta['scale']}, {meta['mode']}, {meta['event_loop']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def draw(ax, panel: dict[str, Any]) -> None:
    ax.set_title(panel.get("title", ""), fontsize=10)
    ax.set_xlabel(panel.get("xlabel", ""))
    ax.set_ylabel(panel.get("ylabel", ""))
    kind = panel["kind"]
    if kind == "bar":
        labels, series = panel["labels"], panel["series"]
        width = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series.items()):
            xs = [x + i * width for x in range(len(labels))]
            ax.bar(xs, [v or 0 for v in values], width, label=name)
        ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))])
        ax.set_xticklabels(labels, fontsize=8, rotation=15)
    elif kind in ("line", "scatter"):
        for name, (xs, ys) in panel["series"].items():
            if kind == "line":
                ax.plot(xs, ys, marker="o", label=name)
            else:
                ax.scatter(xs, ys, s=8, label=name)
        if panel.get("logx"):
            ax.set_xscale("log")
    elif kind == "hist":
        for name, values in panel["series"].items():
            ax.hist(values, bins=40, alpha=0.7, label=name)
    if panel.get("logy"):
        ax.set_yscale("log")
    for y, label in panel.get("hlines", []):
        ax.axhline(y, color="red", linestyle="--", linewidth=1, label=label)
    for x0, x1, label in panel.get("spans", []):
        ax.axvspan(x0, x1, color="orange", alpha=0.15, label=label)
    if kind != "text":
        ax.legend(fontsize=8)
