"""Envoy adapter: an ext_proc gRPC service. Translates; never decides."""
