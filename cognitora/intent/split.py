"""Weighted rewrite (A/B, canary): ``X -> {X-v1: 90, X-v2: 10}``, sticky by hashing who is asking.

The same key always lands in the same bucket of ``[0, total weight)``, and buckets are laid out in the versions'
written order, so a user stays on one version while the weights stay, and moving 10 points from v1 to v2 moves only
the users whose buckets changed hands (about 10% of them), never reshuffles everyone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["pick_version"]


def bucket(key: str, total: int) -> int:
    """A stable bucket of ``[0, total)`` for ``key`` (blake2b: fast, and the same in every process and release)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % total


def pick_version(split: Mapping[str, int], key: str) -> str:
    """The version of ``split`` (``{version: weight}``, weights summing to more than 0) that ``key`` gets."""
    total = sum(split.values())
    point = bucket(key, total)
    for version, weight in split.items():
        if point < weight:
            return version
        point -= weight
    raise AssertionError("unreachable: the weights sum to total")
