"""PNG plots of a run: fitness over time per island, archive heatmaps, credit per diagnosis and
expert. Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend), so
they work headless and in any thread."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Series = Sequence[tuple[float, float | None]]
"""(seconds since start, value) points; ``None`` where nothing was measured yet."""


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def plot_fitness(best: Mapping[str, Series], evaluated: Mapping[str, Series], path: Path) -> Path:
    """Best fitness over time per island (lines) and each evaluated fitness (dots)."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    for island in sorted(set(best) | set(evaluated)):
        pts = [(t, v) for t, v in best.get(island, ()) if v is not None]
        line = ax.step([t for t, _ in pts], [v for _, v in pts], where="post", label=f"{island} best")
        dots = [(t, v) for t, v in evaluated.get(island, ()) if v is not None]
        if dots:
            ax.scatter([t for t, _ in dots], [v for _, v in dots], s=10, alpha=0.4, color=line[0].get_color())
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("speedup over eager (fitness)")
    ax.set_title("Fitness over time per island")
    ax.grid(alpha=0.3)
    if best or evaluated:
        ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def plot_heatmaps(
    grids: Mapping[str, Sequence[Sequence[float | None]]],
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    axis_names: tuple[str, str],
    path: Path,
) -> Path:
    """One heatmap per island: best fitness per archive cell (blank where no elite)."""
    islands = sorted(grids) or ["(none)"]
    cols = min(3, len(islands))
    rows = math.ceil(len(islands) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.6 * rows))
    values = [v for g in grids.values() for row in g for v in row if v is not None]
    vmax = max(values) if values else 1.0
    image = None
    for k, island in enumerate(islands):
        ax = fig.add_subplot(rows, cols, k + 1)
        grid = grids.get(island, [])
        data = [[math.nan if v is None else v for v in row] for row in grid] or [[math.nan]]
        image = ax.imshow(data, origin="lower", cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        for r, row in enumerate(grid):
            for c, v in enumerate(row):
                if v is not None:
                    ax.text(c, r, f"{v:.2g}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(x_labels)), list(x_labels), fontsize=7)
        ax.set_yticks(range(len(y_labels)), list(y_labels), fontsize=7)
        ax.set_xlabel(axis_names[0])
        ax.set_ylabel(axis_names[1])
        ax.set_title(f"archive of {island}", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, shrink=0.8, label="best speedup")
    return _save(fig, path)


def plot_credit(
    keys: Sequence[str],
    experts: Sequence[str],
    mean: Sequence[Sequence[float | None]],
    pulls: Sequence[Sequence[int]],
    path: Path,
) -> Path:
    """Mean reward per (diagnosis, expert), annotated with the number of outcomes behind it."""
    fig = Figure(figsize=(1.6 + 1.3 * max(1, len(experts)), 1.2 + 0.42 * max(1, len(keys))))
    ax = fig.add_subplot(1, 1, 1)
    data = [[math.nan if v is None else v for v in row] for row in mean] or [[math.nan]]
    image = ax.imshow(data, cmap="magma", vmin=0.0, vmax=1.0, aspect="auto")
    for r, row in enumerate(mean):
        for c, v in enumerate(row):
            if pulls[r][c]:
                text = f"{v:.2f}\nn={pulls[r][c]}" if v is not None else f"n={pulls[r][c]}"
                ax.text(c, r, text, ha="center", va="center", fontsize=7, color="cyan")
    ax.set_xticks(range(len(experts)), list(experts), fontsize=8, rotation=30)
    ax.set_yticks(range(len(keys)), list(keys), fontsize=8)
    ax.set_title("Credit: mean reward per diagnosis and expert")
    fig.colorbar(image, ax=ax, label="mean reward")
    return _save(fig, path)
