"""Prefill/decode disaggregation: a request's prefill on one engine, its decode on another, placed as a pair.

- ``pair``: the placement of a pair, in seconds like every placement (docs/disaggregation.md);
- ``wire``: every header name and body field the pair's protocols use, in one place;
- ``protocols``: the two requests of a pair per engine kind (vLLM NIXL, SGLang bootstrap, TRT-LLM);
- ``sidecar``: ``cognitora pd-sidecar``, beside each decode engine: runs the two steps and their faults.

A model joins in by listing ``role: prefill`` endpoints; its ``role: decode`` endpoints are reached through their
sidecars. A model with no prefill endpoint is placed exactly as before.
"""

from __future__ import annotations

from cognitora.disagg.pair import place_with_pairs, uses_pairs

__all__ = ["place_with_pairs", "uses_pairs"]
