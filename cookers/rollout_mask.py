"""The attention mask of a prefix tree, from its structure alone (`node_lengths`, `sample_paths`).

Every token attends causally to the tokens of its own node and fully to every token of the node's
ancestors; nothing else. Node a is an ancestor of node b when a comes before b on some sample path. The
structure must be a forest: every node has one parent across all paths (the node before it, or none),
which is what `cookers.rollouts` produces for one group and for groups packed together.

Tokens past the structure (padding up to a multiple) attend causally to padding only, so that no row of
the mask is empty.

This module is the dense reference (boolean [T, T], numpy): exact, and fine up to a few thousand
tokens. `cookers.energon_rollouts` builds the same mask as a torch flex-attention `mask_mod` /
`BlockMask` from the same `token_visibility`, the form that runs fast on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def node_parents(num_nodes: int, sample_paths: Sequence[Sequence[int]]) -> np.ndarray:
    """The parent of every node (-1 for a root, or a node on no path); ValueError unless a forest.

    >>> node_parents(4, [[0, 1], [0, 2], [3]]).tolist()
    [-1, 0, 0, -1]
    """
    parents = np.full(num_nodes, -2, dtype=np.int64)  # -2: not seen yet
    for number, path in enumerate(sample_paths):
        if len(path) == 0:
            raise ValueError(f"sample path {number} is empty; a path names the nodes from a root to a leaf")
        before = -1
        for node in path:
            node = int(node)
            if not 0 <= node < num_nodes:
                raise ValueError(f"sample path {number} names node {node}, but there are {num_nodes} nodes")
            if parents[node] == -2:
                parents[node] = before
            elif parents[node] != before:
                had = "no node" if parents[node] == -1 else f"node {parents[node]}"
                now = "no node" if before == -1 else f"node {before}"
                raise ValueError(
                    f"node {node} follows {had} on an earlier sample path and {now} on sample path {number};"
                    " sample paths must form a tree (one parent per node)"
                )
            before = node
    parents[parents == -2] = -1
    return parents


def visible_nodes(num_nodes: int, sample_paths: Sequence[Sequence[int]]) -> np.ndarray:
    """Boolean [N, N]: `visible[a, b]` when tokens of node a may see node b (b is a, or an ancestor of a).

    >>> visible_nodes(3, [[0, 1], [0, 2]]).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    """
    parents = node_parents(num_nodes, sample_paths)
    visible = np.eye(num_nodes, dtype=bool)
    for node in range(num_nodes):
        ancestor, steps = parents[node], 0
        while ancestor >= 0:
            visible[node, ancestor] = True
            ancestor, steps = parents[ancestor], steps + 1
            if steps > num_nodes:  # unreachable for parents built from paths; guards the loop
                raise ValueError(f"node {node} has a cycle of parents")
    return visible


def node_of_tokens(node_lengths: Sequence[int], total: int | None = None) -> np.ndarray:
    """The node of every token; tokens past the structure (padding) get node N, one past the last.

    >>> node_of_tokens([2, 1, 1], total=6).tolist()
    [0, 0, 1, 2, 3, 3]
    """
    lengths = np.asarray(node_lengths, dtype=np.int64).reshape(-1)
    if len(lengths) and lengths.min() < 0:
        raise ValueError("node lengths must not be negative")
    structured = int(lengths.sum())
    total = structured if total is None else total
    if total < structured:
        raise ValueError(f"the structure covers {structured} tokens, more than the {total} given")
    nodes = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return np.concatenate((nodes, np.full(total - structured, len(lengths), dtype=np.int64)))


def token_visibility(
    node_lengths: Sequence[int], sample_paths: Sequence[Sequence[int]], total: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The two small arrays every form of the mask is computed from: the node of each token
    (`node_of_tokens`, padding as node N) and which node sees which ([N + 1, N + 1], padding sees itself).

    Token q may attend to token k when `visible[nodes[q], nodes[k]]`, and `k <= q` if they share a node.
    """
    num_nodes = len(node_lengths)
    nodes = node_of_tokens(node_lengths, total)
    visible = np.zeros((num_nodes + 1, num_nodes + 1), dtype=bool)
    visible[:num_nodes, :num_nodes] = visible_nodes(num_nodes, sample_paths)
    visible[num_nodes, num_nodes] = True
    return nodes, visible


def prefix_tree_mask(
    node_lengths: Sequence[int], sample_paths: Sequence[Sequence[int]], total: int | None = None
) -> np.ndarray:
    """Dense boolean [T, T] attention mask (True = may attend) of a prefix tree; T = `total` or the
    structure's length.

    >>> prefix_tree_mask([2, 1, 1], [[0, 1], [0, 2]]).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [1, 1, 0, 1]])
    """
    nodes, visible = token_visibility(node_lengths, sample_paths, total)
    same = nodes[:, None] == nodes[None, :]
    causal = np.tri(len(nodes), dtype=bool)
    return visible[nodes[:, None], nodes[None, :]] & (~same | causal)
