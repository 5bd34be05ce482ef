"""Intent-based and weighted model rewrite, decided once in the core before placement (docs/intent.md)."""

from cognitora.intent.rewrite import Rewriter
from cognitora.intent.source import IntentSource
from cognitora.intent.verdict import How, Rewrite

__all__ = ["How", "IntentSource", "Rewrite", "Rewriter"]
