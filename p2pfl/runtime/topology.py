"""Who talks to whom: the communication graph of a run (`runtime.topology`).

    full            every node is every other's neighbour (all-to-all)
    ring            node i's neighbours are i - 1 and i + 1 (mod N)
    regular:d       a random d-regular graph
    small_world:d   Watts-Strogatz: a ring lattice where each node links to its d nearest,
                    each edge rewired with probability 0.1

Random graphs are drawn from the scenario's seed and redrawn until connected, so every node
computes the same graph by itself and no one needs to hand it out. A node fetches from (and
waits for) its neighbours only; algorithms that choose whom to download choose among them.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import TYPE_CHECKING

from p2pfl.errors import ConfigError

if TYPE_CHECKING:
    import networkx as nx

TOPOLOGIES = ("full", "ring", "regular:d", "small_world:d")
SMALL_WORLD_REWIRING = 0.1
CONNECT_TRIES = 100
LOCALITY_BLOCK = 64  # locality_order bisects down to runs of at most this many nodes


@dataclass(frozen=True)
class Topology:
    kind: str
    degree: int | None = None

    @classmethod
    def parse(cls, text: str) -> Topology:
        kind, _, degree = text.partition(":")
        if kind in ("full", "ring") and not degree:
            return cls(kind)
        if kind in ("regular", "small_world") and degree.isdigit() and int(degree) >= 2:
            return cls(kind, int(degree))
        raise ConfigError("runtime.topology", f"unknown topology {text!r}; choose one of {TOPOLOGIES} (d >= 2)")

    def __str__(self) -> str:
        return self.kind if self.degree is None else f"{self.kind}:{self.degree}"

    def check(self, nodes: int) -> None:
        """A ConfigError when this graph cannot be drawn on `nodes` nodes."""
        if self.degree is None:
            return
        if self.degree >= nodes:
            raise ConfigError("runtime.topology", f"{self} needs more than {self.degree} nodes, the scenario has {nodes}")
        if self.kind == "regular" and nodes * self.degree % 2:
            raise ConfigError("runtime.topology", f"{self}: a {self.degree}-regular graph on {nodes} nodes does not "
                                                  "exist (nodes x d must be even)")

    def graph(self, nodes: int, seed: int) -> nx.Graph:
        """The graph on nodes 0..nodes-1; connected."""
        import networkx as nx  # here: checking a scenario's topology field needs no graph library

        self.check(nodes)
        if self.kind == "full":
            return nx.complete_graph(nodes)
        if self.kind == "ring":
            return nx.cycle_graph(nodes)
        assert self.degree is not None
        if self.kind == "small_world":
            return nx.connected_watts_strogatz_graph(nodes, self.degree, SMALL_WORLD_REWIRING, tries=CONNECT_TRIES,
                                                     seed=seed)
        for attempt in range(CONNECT_TRIES):
            graph = nx.random_regular_graph(self.degree, nodes, seed=seed * CONNECT_TRIES + attempt)
            if nx.is_connected(graph):
                return graph
        raise ConfigError("runtime.topology", f"no connected {self} graph on {nodes} nodes in {CONNECT_TRIES} draws")

    def locality_order(self, nodes: int, seed: int) -> list[int]:
        """The nodes in an order where a run of consecutive ones has few edges leaving it: the
        shares placement "shared" deals its workers are runs of this list, and a neighbour in the
        same worker is reached in memory (`runtime.transport = "colocated"`). A ring and a small
        world are in order already; a random regular graph is cut by recursive Kernighan-Lin
        bisection (1000 nodes of regular:4 in two halves: 15 % of the edges between them, against
        50 % for any split of a random order); every split of a full graph is alike."""
        if self.kind != "regular":
            return list(range(nodes))
        from networkx.algorithms.community import kernighan_lin_bisection

        graph = _graph(self, nodes, seed)

        def ordered(members: list[int]) -> list[int]:
            if len(members) <= LOCALITY_BLOCK:
                return sorted(members)
            left, right = kernighan_lin_bisection(graph.subgraph(members), seed=seed)
            return ordered(sorted(left)) + ordered(sorted(right))

        return ordered(list(range(nodes)))

    def neighbours(self, nodes: int, seed: int) -> list[list[int]]:
        """For each node, its neighbours in increasing order."""
        return [list(row) for row in _neighbour_rows(self, nodes, seed)]

    def neighbours_of(self, index: int, nodes: int, seed: int) -> list[int]:
        """Node `index`'s neighbours in increasing order; the graph is drawn once per process."""
        return list(_neighbour_rows(self, nodes, seed)[index])


@functools.lru_cache(maxsize=1)
def _graph(topology: Topology, nodes: int, seed: int) -> nx.Graph:
    return topology.graph(nodes, seed)


@functools.lru_cache(maxsize=4)
def _neighbour_rows(topology: Topology, nodes: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """Every node's neighbours, once per process: nodes sharing a worker draw the graph once, not
    once each (a 1000-node regular graph costs 25 ms; a worker of 500 nodes paid 12 s)."""
    graph = _graph(topology, nodes, seed)
    return tuple(tuple(sorted(graph.neighbors(i))) for i in range(nodes))
