"""The search's picture: expected latency vs energy of every feasible candidate, the Pareto set
coloured by accuracy, the single-unit baselines and the pick marked."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # the backend is chosen first: no display here

from dynnet_ros.mapper.search import Candidate, SearchResult


def plot_pareto(result: SearchResult, chosen: Candidate | None, path: str | Path, title: str,
                extra: Sequence[Candidate] = ()) -> Path:
    """Write the PNG; ``extra``: more labelled points (e.g. the static split)."""
    fig, ax = plt.subplots(figsize=(7, 5))
    if result.everything:
        ax.scatter([c.latency_ms for c in result.everything], [c.energy_mj for c in result.everything],
                   s=8, c="lightgrey", label=f"evaluated ({result.feasible} feasible)")
    front = ax.scatter([c.latency_ms for c in result.pareto], [c.energy_mj for c in result.pareto],
                       c=[c.accuracy for c in result.pareto], cmap="viridis", s=30, edgecolors="black",
                       linewidths=0.4, label="Pareto set", vmin=min([c.accuracy for c in result.pareto] + [0.99]),
                       vmax=1.0)
    fig.colorbar(front, ax=ax, label="accuracy proxy (agreement with the final exit)")
    for base in list(result.baselines) + list(extra):
        ax.scatter([base.latency_ms], [base.energy_mj], marker="X", s=80, color="tab:red")
        ax.annotate(base.label, (base.latency_ms, base.energy_mj), textcoords="offset points", xytext=(5, 5),
                    fontsize=8)
    if chosen is not None:
        ax.scatter([chosen.latency_ms], [chosen.energy_mj], marker="*", s=220, color="gold", edgecolors="black",
                   label="pick")
    ax.set_xlabel("expected latency (ms)")
    ax.set_ylabel("expected energy (mJ)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
