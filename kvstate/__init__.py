"""The fleet's state: which engine holds which KV blocks, how busy each engine is, what it draws."""

__all__: list[str] = []
