"""Intent-based and weighted model rewrite, decided once in the core before placement (docs/intent.md)."""

from cognitora.intent.rewrite import How, Rewrite, Rewriter
from cognitora.intent.source import IntentSource

__all__ = ["How", "IntentSource", "Rewrite", "Rewriter"]
