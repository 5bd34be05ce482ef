"""Envoy adapter: an ext_proc gRPC service. Translates; never decides."""

__all__: list[str] = []
