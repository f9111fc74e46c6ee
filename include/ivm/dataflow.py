"""A project's dataflow as a picture: its tables on the left, its views to the right of what they read, one
column per stratum (the order a refresh maintains them in), each view labelled with the algorithm that
maintains it (`ivm explain`), each arrow a table or view a view reads directly. The demo draws it
(the README's picture); `draw` writes any project's as a PNG (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from ivm.explain import Explanation


def direct_inputs(depends_on: dict[str, set[str]], relations: set[str], view: str) -> set[str]:
    """The tables and views ``view`` reads directly: its dependencies, looking through the auxiliary
    predicates its rules define (they are part of the view, not of the picture).

    >>> sorted(direct_inputs({"v": {"v__1"}, "v__1": {"t", "w"}, "w": {"t"}}, {"t", "w", "v"}, "v"))
    ['t', 'w']
    """
    found, todo, seen = set(), list(depends_on.get(view, ())), set()
    while todo:
        pred = todo.pop()
        if pred in seen:
            continue
        seen.add(pred)
        if pred in relations:
            if pred != view:
                found.add(pred)
        else:
            todo.extend(depends_on.get(pred, ()))
    return found


def draw(tables: list[str], views: dict[str, Explanation], depends_on: dict[str, set[str]], path: str | Path,
         title: str = "") -> Path:
    """Write the dataflow of ``tables`` and ``views`` (their explanations) as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strata = sorted({e.stratum for e in views.values()})
    column = {0: 0, **{s: i + 1 for i, s in enumerate(strata)}}
    columns: dict[int, list[str]] = {0: sorted(tables)}
    for name, e in sorted(views.items()):
        columns.setdefault(column[e.stratum], []).append(name)
    height = max(len(names) for names in columns.values())
    # each column spread over the picture's height, top to bottom
    where = {name: (x, (height - 1) / 2 - (i * (height - 1) / (len(names) - 1) if len(names) > 1 else (height - 1) / 2))
             for x, names in columns.items() for i, name in enumerate(names)}
    fig, ax = plt.subplots(figsize=(3.4 * len(columns), 0.8 * height + 1.2))
    boxes = {}
    for name, (x, y) in where.items():
        if name in views:
            label, colour = f"{name}\n{views[name].algorithm}", "#fde7c8"
        else:
            label, colour = name, "#d6e6f5"
        boxes[name] = ax.text(x, y, label, ha="center", va="center", fontsize=8, zorder=3,
                              bbox={"boxstyle": "round,pad=0.35", "fc": colour, "ec": "#555555", "lw": 0.6})
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylim(-(height - 1) / 2 - 0.7, (height - 1) / 2 + 1.3)
    fig.canvas.draw()  # (places the boxes, so the arrows can be clipped to them)
    relations = set(tables) | set(views)
    for name in views:
        for source in direct_inputs(depends_on, relations, name):
            # (clipped to the two boxes: the arrow runs from one's edge to the other's)
            ax.annotate("", xy=where[name], xytext=where[source], zorder=4,
                        arrowprops={"arrowstyle": "-|>", "mutation_scale": 9, "color": "#7a7a7a", "lw": 0.8,
                                    "shrinkA": 2, "shrinkB": 4,
                                    "patchA": boxes[source].get_bbox_patch(), "patchB": boxes[name].get_bbox_patch()})
    for x in columns:
        ax.text(x, (height - 1) / 2 + 0.9, "tables" if x == 0 else f"stratum {strata[x - 1]}", ha="center",
                fontsize=9, fontweight="bold")
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylim(-(height - 1) / 2 - 0.7, (height - 1) / 2 + 1.3)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out
