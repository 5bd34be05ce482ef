"""Every request surface a client speaks (OpenAI chat, completions, embeddings, Responses; Anthropic Messages),
read with the engine's own rules into one ``SurfaceRequest``: its prompt as the engine renders it, its media keyed by
content, its output cap. docs/surfaces.md has the rules, surface by surface, and where they come from in vLLM."""

from kvstate.surfaces.history import PriorResponse, ResponseHistory, response_output_texts
from kvstate.surfaces.media import MediaRef
from kvstate.surfaces.read import COUNT_TOKENS_PATH, SURFACE_PATHS, read_surface, surface_of_path
from kvstate.surfaces.request import OUTPUT_CAP_FIELDS, SURFACES, SurfaceError, SurfaceName, SurfaceRequest
from kvstate.surfaces.template_traits import DEFAULT_TRAITS, TemplateTraits, template_traits
from kvstate.surfaces.tokens import surface_keys, surface_prompt_chars, surface_token_ids

__all__ = [
    "COUNT_TOKENS_PATH",
    "DEFAULT_TRAITS",
    "OUTPUT_CAP_FIELDS",
    "SURFACES",
    "SURFACE_PATHS",
    "MediaRef",
    "PriorResponse",
    "ResponseHistory",
    "SurfaceError",
    "SurfaceName",
    "SurfaceRequest",
    "TemplateTraits",
    "read_surface",
    "response_output_texts",
    "surface_keys",
    "surface_of_path",
    "surface_prompt_chars",
    "surface_token_ids",
    "template_traits",
]
