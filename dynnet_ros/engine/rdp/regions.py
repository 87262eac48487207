"""Partition of the graph into regions (SoD² Fig. 8a).

A region grows along data edges between nodes of the same class (nac outputs or
not).  A node whose output turns nac, an EDO node, or a control-flow node (a
region of its own) bounds regions; each region is labelled by the kinds of the
tensors its nodes produce: all-known, mixed-symbolic or contains-nac.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Region:
    index: int
    nodes: list[str] = field(default_factory=list)
    label: str = "all-known"  # all-known | mixed-symbolic | contains-nac

    def to_json(self) -> dict:
        return {"index": self.index, "label": self.label, "nodes": list(self.nodes)}


def find_regions(records, kinds: dict[str, str]) -> tuple[list[Region], dict[str, int]]:
    """records: NodeRecords in topological order; kinds: tensor name -> kind."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    producer: dict[str, str] = {}
    edo: set[str] = set()
    control: set[str] = set()
    is_nac: dict[str, bool] = {}
    for r in records:
        parent[r.name] = r.name
        if r.subgraph or r.op_type in ("Switch", "Combine"):
            control.add(r.name)
        if r.category == "EDO":
            edo.add(r.name)
        is_nac[r.name] = any(kinds.get(o) == "nac" for o in r.outputs if o)
        for o in r.outputs:
            if o:
                producer[o] = r.name
    for r in records:
        if r.name in control:
            continue
        for x in r.inputs:
            p = producer.get(x)
            if p is None or p in edo or p in control or is_nac[p] != is_nac[r.name]:
                continue
            union(p, r.name)
    order: dict[str, int] = {}
    regions: list[Region] = []
    node_region: dict[str, int] = {}
    for r in records:
        root = find(r.name)
        if root not in order:
            order[root] = len(regions)
            regions.append(Region(len(regions)))
        reg = regions[order[root]]
        reg.nodes.append(r.name)
        node_region[r.name] = reg.index
        for o in r.outputs:
            k = kinds.get(o)
            if k == "nac":
                reg.label = "contains-nac"
            elif k == "symbolic" and reg.label == "all-known":
                reg.label = "mixed-symbolic"
    return regions, node_region
