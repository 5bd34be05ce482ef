"""``python -m cognitora.config``: print the configuration reference (docs/config.md's generated section)."""

from cognitora.config.reference import reference_markdown

__all__: list[str] = []

if __name__ == "__main__":
    print(reference_markdown())
