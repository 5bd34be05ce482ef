"""A LiteLLM callback that overrides the hooks Cognitora's plugin overrides and does nothing in them.

The ``litellm-shuffle-logged`` target loads it (``litellm_settings.callbacks``) beside LiteLLM's own
simple-shuffle, to measure what the LiteLLM proxy charges any deployment for having such a callback (its logging
and per-stream machinery) apart from what Cognitora's plugin does in its hooks. Every real deployment has some
callback (spend logs, Langfuse, Prometheus); a proxy with none at all is the lightest LiteLLM can be.

LiteLLM imports this file from the directory of the proxy's config (the target copies it there), not from the
project, so it imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from litellm.integrations.custom_logger import CustomLogger


class PassThroughCallbacks(CustomLogger):
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        return None

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        return None

    async def async_post_call_failure_deployment_hook(
        self, request_data: Any, exception: Exception, call_type: Any, fallback_depth: int | None = None
    ) -> None:
        return None

    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: Any
    ) -> Any:
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        async for chunk in response:
            yield chunk

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        return None


callbacks = PassThroughCallbacks()
