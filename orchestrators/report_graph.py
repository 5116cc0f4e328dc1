"""The candidate graph of a report, drawn so that it stays readable at 50 and more nodes.

networkx holds the graph and lays it out in columns by depth (``multipartite_layout``): siblings stack
down a column, so a root with fifty children gives a tall picture, never fifty labels on one line. Each
node carries one label to its right (strategy, speedup interval, status); edges carry no text (a fix is
dashed, a tuning step dotted); the path from the root to the best node is drawn thick.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from jaxbench.report import format_interval
from orchestrators.graph import ROOT, Node
from orchestrators.report_data import reading_of

ROW_IN = 0.32  # inches between two nodes of one column: one line of 7-point text and a gap
COLUMN_IN = 4.2  # inches between two columns: the widest label fits before the next column starts
LABEL_CHARS = 44


def build(nodes: list[Node]) -> nx.DiGraph:
    """The candidates as a tree under the reference: a node whose parent is not among them hangs off it."""
    graph = nx.DiGraph()
    graph.add_node(ROOT, depth=0)
    ids = {n.candidate_id for n in nodes}
    for node in sorted(nodes, key=lambda n: n.seq):
        if node.candidate_id in graph:  # a re-measurement of a candidate placed already: one point per kernel
            continue
        parent = node.parent_id if node.parent_id in ids else ROOT
        depth = graph.nodes[parent]["depth"] + 1 if parent in graph else 1
        graph.add_node(node.candidate_id, depth=depth)
        graph.add_edge(parent, node.candidate_id, edge=node.edge)
    return graph


def best_path(graph: nx.DiGraph, best: str | None) -> list[str]:
    """The root-to-best path (empty without a best)."""
    if best is None or best not in graph:
        return []
    return nx.shortest_path(graph, ROOT, best)


def node_label(node: Node) -> str:
    """Strategy, speedup interval and status: ``template:rowblock · 1.02–1.09x · ok``."""
    strategy = node.strategy if len(node.strategy) <= LABEL_CHARS else node.strategy[: LABEL_CHARS - 1] + "…"
    if node.passed and node.interval:
        return f"{strategy} · {format_interval(node.interval)} · {node.status}"
    return f"{strategy} · {node.status}"


def layout(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Positions in inches: one column per depth, nodes of a column ``ROW_IN`` apart, in the order judged."""
    raw = nx.multipartite_layout(graph, subset_key="depth", align="vertical")
    columns: dict[int, list[str]] = {}
    for name in graph.nodes:
        columns.setdefault(graph.nodes[name]["depth"], []).append(name)
    pos: dict[str, tuple[float, float]] = {}
    for depth, members in columns.items():
        members.sort(key=lambda m: -raw[m][1])  # keep the library's order within the column
        for i, name in enumerate(members):
            pos[name] = (depth * COLUMN_IN, -i * ROW_IN)
    return pos


def figure(nodes: list[Node], best: str | None) -> Any:
    """A matplotlib figure of the graph, sized to it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graph = build(nodes)
    pos = layout(graph)
    path = best_path(graph, best)
    on_path = set(zip(path, path[1:]))
    # a candidate judged again (its re-measurements) is one point, labelled with the reading the report shows
    by_id = {cid: reading_of(nodes, cid) for cid in dict.fromkeys(n.candidate_id for n in nodes)}
    rows = max(1, max(len([p for p in pos.values() if p[0] == x]) for x in {p[0] for p in pos.values()}))
    depth = max(graph.nodes[n]["depth"] for n in graph.nodes)
    fig = plt.figure(figsize=((depth + 1) * COLUMN_IN + 0.5, rows * ROW_IN + 1.0))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(-0.3, (depth + 1) * COLUMN_IN + 0.2)
    ax.set_ylim(-(rows - 1) * ROW_IN - 0.4, 0.6)
    for parent, child in graph.edges:
        (x0, y0), (x1, y1) = pos[parent], pos[child]
        kind = graph.edges[parent, child]["edge"]
        style = "--" if kind == "fix" else ":" if kind == "tune" else "-"
        bold = (parent, child) in on_path
        ax.plot([x0, x1], [y0, y1], ls=style, lw=2.6 if bold else 0.7, c="#e09f3e" if bold else "#aaa", zorder=1)
    ax.scatter([pos[ROOT][0]], [pos[ROOT][1]], s=90, c="#444", zorder=3)
    ax.text(pos[ROOT][0] + 0.12, pos[ROOT][1], "reference", va="center", fontsize=7, gid=f"label:{ROOT}")
    for cid, node in by_id.items():
        assert node is not None
        x, y = pos[cid]
        colour = "#2a9d4b" if node.passed else "#d1495b"
        edge = "#e09f3e" if cid in path else colour
        ax.scatter([x], [y], s=60, c=colour, edgecolors=edge, linewidths=2.0 if cid in path else 0.5, zorder=3)
        weight = "bold" if cid == best else "normal"
        ax.text(x + 0.12, y, node_label(node) + ("  ★ best" if cid == best else ""), va="center", fontsize=7,
                fontweight=weight, gid=f"label:{cid}")
    ax.set_axis_off()
    return fig
