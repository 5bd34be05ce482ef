"""A chat request -> the text the engine tokenizes, rendered as vLLM's OpenAI server renders it.

vLLM (``vllm/renderers/chat_utils``, ``vllm/renderers/hf.py``) does three things before the template runs, and
transformers (``apply_chat_template``, ``chat_template_utils.render_jinja_template``) one more; each is mirrored
here, because a prompt rendered one character differently gets different block keys:

1. **Messages become a conversation** (``conversation``). The content *format* depends on the template: one that
   loops over ``message['content']`` gets ``openai`` content (a list of ``{"type": "text", "text": ...}`` parts,
   a plain string included), any other gets ``string`` content (text parts joined with ``"\\n"``). vLLM detects
   this from the template's syntax tree (``detect_content_format``). Content ``None`` is empty. Assistant
   ``tool_calls`` keep their list, their ``arguments`` parsed from JSON text into an object (``{}`` when empty or
   not a JSON object); tool messages keep ``tool_call_id``; ``name`` is kept when it is a string.
2. **Tools** are what vLLM's pydantic model dumps (``tool_schemas``): ``{"type": "function", "function": {"name",
   "description", "parameters", "strict", "defer_loading"}}``, ``description``/``parameters`` present as ``None``
   when the client left them out, ``strict`` and ``defer_loading`` only when set, any other field dropped (vLLM
   0.32's ``FunctionDefinition`` and ``ChatCompletionToolsParam`` serialize their own fields only). Assistant
   ``tool_calls`` reach the template in the order vLLM's request validation writes them (``chat_request_messages``,
   applied by ``kvstate.prompt.read_prompt``): ``{"id", "function": {"arguments", "name"}, "type"}``, other keys
   after; this matters to a template that prints a whole call as JSON.
3. **The template's scope**: ``messages``, ``tools`` (None without tools), ``documents`` (None),
   ``add_generation_prompt``, every named special token of ``tokenizer_config.json`` (``bos_token``,
   ``eos_token``, ...), then the request's ``chat_template_kwargs`` over them.
4. **The environment** is transformers': an immutable sandbox with ``trim_blocks``/``lstrip_blocks``, the
   ``{% generation %}`` tag and loop controls, a ``tojson`` that does not escape HTML, ``raise_exception`` and
   ``strftime_now``. ``continue_final_message`` cuts the render right after the last message's text.
5. **A ``developer`` message** a template does not name (``'developer'`` nowhere in its text) becomes a ``system``
   message, and the system messages are then merged into one, first (vLLM's ``safe_apply_chat_template``).

Media parts (images, audio, video) contribute no text here: vLLM replaces them with model-specific placeholder
tokens and hashes the media into its blocks, which a router cannot reproduce, so keys stay exact up to the first
media part and simply miss after it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

__all__ = [
    "MEDIA_PARTS",
    "ChatTemplate",
    "ContentFormat",
    "PromptError",
    "chat_request_messages",
    "conversation",
    "detect_content_format",
    "load_chat_template",
    "special_tokens_map",
    "tool_schemas",
]

Message = Mapping[str, Any]
ContentFormat = Literal["string", "openai"]


class PromptError(ValueError):
    """The prompt cannot be read, rendered or tokenized (bad message shape, template error): the client's 400."""


# -- 1. messages -> conversation ------------------------------------------------------------------------------

# Part type -> the key holding its text (vLLM's MM_PARSER_MAP, text entries).
_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
MEDIA_PARTS: dict[str, Literal["image", "audio", "video"]] = {
    # Part type (or, untyped, the key present) -> the modality an ``openai``-format template sees (vLLM's
    # MM_PARSER_MAP, media entries).
    "image_url": "image",
    "input_image": "image",
    "image_embeds": "image",
    "image_pil": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
}
# Fields of OpenAI's content-part shapes: what is left over is passed on to an ``openai``-format template.
_KNOWN_PART_FIELDS = frozenset(
    {"type", "text", "refusal", "thinking", "closed", "name", "uuid", "detail", "data", "file", *MEDIA_PARTS}
)


def conversation(messages: Sequence[Message], content_format: ContentFormat = "string") -> list[dict[str, Any]]:
    """The conversation vLLM hands the chat template (see the module docstring, step 1). The input is not mutated."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise PromptError("'messages' must be a list of {role, content} objects")
    out = [_message(i, m, content_format) for i, m in enumerate(messages)]
    for message in out:
        _parse_tool_call_arguments(message)
    return out


def _message(i: int, message: Message, content_format: ContentFormat) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise PromptError(f"messages[{i}] must be an object with 'role' and 'content'")
    role = message.get("role")
    if not isinstance(role, str):
        raise PromptError(f"messages[{i}] needs a string 'role'")
    content = message.get("content")
    if content is None:
        parts: Sequence[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise PromptError(f"messages[{i}].content must be a string or a list of parts, got {type(content).__name__}")
    out: dict[str, Any] = {"role": role, "content": _content(i, parts, content_format)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            out["tool_calls"] = copy.deepcopy(list(message["tool_calls"]))
        if message.get("reasoning") is not None:
            out["reasoning"] = out["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        body = out["content"]
        if isinstance(body, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in body):
            # Most templates print a tool result as a string: vLLM flattens all-text results to one.
            out["content"] = "\n".join(p.get("text", "") for p in body)
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if isinstance(message.get("task"), str):
        out["task"] = message["task"]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _content(i: int, parts: Sequence[Any], content_format: ContentFormat) -> str | list[dict[str, Any]]:
    texts: list[str] = []
    wrapped: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
            wrapped.append({"type": "text", "text": part})
            continue
        if not isinstance(part, Mapping):
            raise PromptError(f"messages[{i}].content[{j}] must be a string or an object with a 'type'")
        kind = part.get("type")
        if kind is None:
            kind = next((k for k in MEDIA_PARTS if k in part), "tool_reference" if "tool_reference" in part else None)
        if not isinstance(kind, str):
            raise PromptError(f"messages[{i}].content[{j}] has no 'type'")
        extra = {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}
        if kind in _TEXT_PARTS:
            text = part.get(_TEXT_PARTS[kind])
            if text is None:
                continue  # vLLM skips a text part without text
            texts.append(str(text))
            wrapped.append({"type": "text", "text": str(text), **extra})
        elif kind in MEDIA_PARTS:
            wrapped.append({"type": MEDIA_PARTS[kind], **extra})
        elif kind == "tool_reference":
            name = part.get("name")
            if name is not None:
                texts.append(str(name))
            wrapped.append({"type": "tool_reference", "name": name})
        else:
            raise PromptError(f"messages[{i}].content[{j}]: unsupported content part type {kind!r}")
    if content_format == "openai":
        return wrapped
    # vLLM drops empty pieces before joining.
    return "\n".join(t for t in texts if t)


def _parse_tool_call_arguments(message: dict[str, Any]) -> None:
    """Tool-use templates expect ``arguments`` as an object; OpenAI clients send JSON text (vLLM parses it)."""
    if message["role"] != "assistant" or not isinstance(message.get("tool_calls"), list):
        return
    calls: list[Any] = message["tool_calls"]
    if not calls:
        del message["tool_calls"]  # keeps templates on their plain assistant path
        return
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise PromptError("assistant tool_calls entries must be objects of type 'function' with a 'function'")
        arguments = function.get("arguments")
        parsed: Any = arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments else {}
            except ValueError:
                parsed = {}  # vLLM carries on with {}: the history of a conversation must stay usable
        function["arguments"] = parsed if isinstance(parsed, dict) else {}


# -- 2. tools -------------------------------------------------------------------------------------------------


def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The request's ``tools`` as vLLM passes them to the template (see the module docstring, step 2)."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise PromptError("'tools' must be a list of {type, function} objects")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise PromptError(f"tools[{i}] must be an object")
        if tool.get("type", "function") != "function":
            out.append(copy.deepcopy(dict(tool)))
            continue
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise PromptError(f"tools[{i}].function must be an object with a string 'name'")
        fn = {k: copy.deepcopy(function.get(k)) for k in ("name", "description", "parameters")}
        outer_defer = tool.get("defer_loading")
        for k in ("strict", "defer_loading"):
            value = function.get(k)
            if k == "defer_loading" and value is None:
                value = outer_defer  # vLLM copies the tool's defer_loading onto its function
            if value is not None:
                fn[k] = copy.deepcopy(value)
        dumped: dict[str, Any] = {"type": "function", "function": fn}
        if outer_defer is not None:
            dumped["defer_loading"] = copy.deepcopy(outer_defer)
        out.append(dumped)
    return out


_TOOL_CALL_ORDER = ("id", "function", "type")
_FUNCTION_CALL_ORDER = ("arguments", "name")


def chat_request_messages(messages: Sequence[Message]) -> Sequence[Message]:
    """``messages`` as vLLM's chat request validation hands them on: each assistant tool call's keys in its typed
    dicts' order (``{"id", "function": {"arguments", "name"}, "type"}``, any other key after). Only messages with
    tool calls are copied; the input is not mutated."""
    out: list[Message] | None = None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            continue
        if out is None:
            out = list(messages)
        out[i] = {**message, "tool_calls": [_ordered_call(c) for c in calls]}
    return messages if out is None else out


def _ordered(value: Mapping[str, Any], first: tuple[str, ...]) -> dict[str, Any]:
    ordered = {k: value[k] for k in first if k in value}
    ordered.update((k, v) for k, v in value.items() if k not in ordered)
    return ordered


def _ordered_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    ordered = _ordered(call, _TOOL_CALL_ORDER)
    if isinstance(ordered.get("function"), Mapping):
        ordered["function"] = _ordered(ordered["function"], _FUNCTION_CALL_ORDER)
    return ordered


# -- 3. the template's scope ----------------------------------------------------------------------------------

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def special_tokens_map(tokenizer_config: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' ``special_tokens_map`` from a parsed ``tokenizer_config.json``: the names that are set."""

    def text(value: Any) -> str | None:
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping) and isinstance(value.get("content"), str):
            return str(value["content"])  # a serialized AddedToken
        return None

    out: dict[str, Any] = {}
    for name in _SPECIAL_TOKEN_NAMES:
        value = text(tokenizer_config.get(name))
        if value is not None:
            out[name] = value
    extra = tokenizer_config.get("additional_special_tokens")
    if isinstance(extra, list) and extra:
        out["additional_special_tokens"] = [t for t in (text(v) for v in extra) if t is not None]
    return out


# -- 4. the environment ---------------------------------------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; rendering keeps the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers replaces Jinja's tojson, which escapes HTML characters (<, >, &) that must reach the model.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# -- content format detection (vLLM ``_detect_content_format``) -----------------------------------------------


class _Unsure(Exception):
    """The template's shape is beyond the detection's reach (vLLM then falls back to 'string')."""


def _names_var(node: jinja2.nodes.Node, var: str, key: str | None = None) -> bool:
    """``node`` reads ``var`` (or ``var[key]`` / ``var.key``), possibly through filters, tests or a slice."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _names_var(node.node, var, key)
    if isinstance(node, jinja2.nodes.Test):
        return _names_var(node.node, var, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _names_var(node.node, var, key)
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == var
    if isinstance(node, jinja2.nodes.Getitem):
        return _names_var(node.node, var) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _names_var(node.node, var) and node.attr == key
    return False


def _aliases(root: jinja2.nodes.Template, var: str) -> list[str]:
    """``var`` and every name ``{% set %}`` binds to it (or to a slice/filter of it), transitively."""
    names, todo = [var], [var]
    while todo:
        current = todo.pop(0)
        for assign in root.find_all(jinja2.nodes.Assign):
            if _names_var(assign.node, current):
                if not isinstance(assign.target, jinja2.nodes.Name):
                    raise _Unsure
                names.append(assign.target.name)
                if assign.target.name != current:
                    todo.append(assign.target.name)
    return names


def _loop_targets(root: jinja2.nodes.Template, over: Sequence[str], key: str | None = None) -> Iterator[str]:
    for loop in root.find_all(jinja2.nodes.For):
        if any(_names_var(loop.iter, name, key) for name in over):
            if not isinstance(loop.target, jinja2.nodes.Name):
                raise _Unsure
            yield loop.target.name


def detect_content_format(source: str) -> ContentFormat:
    """``openai`` when the template loops over a message's ``content`` (it expects parts), else ``string``."""
    try:
        root = _environment().parse(source)
        message_vars = list(_loop_targets(root, _aliases(root, "messages")))
        next(_loop_targets(root, message_vars, "content"))
    except StopIteration:
        return "string"
    except (_Unsure, jinja2.TemplateError):
        return "string"
    return "openai"


# -- the template ---------------------------------------------------------------------------------------------

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplate:
    """A model's chat template(s), rendered with vLLM's and transformers' rules (see the module docstring).

    ``named`` holds the named templates of a ``tokenizer_config.json`` whose ``chat_template`` is a list: a request
    with tools gets ``tool_use`` when there is one, else ``default`` (transformers' ``get_chat_template``).
    """

    def __init__(
        self,
        source: str | None,
        special_tokens: Mapping[str, Any] | None = None,
        named: Mapping[str, str] | None = None,
    ) -> None:
        self._env = _environment()
        self._sources = dict(named or {})
        if source is not None:
            self._sources["default"] = source
        if "default" not in self._sources and len(self._sources) == 1:
            self._sources["default"] = next(iter(self._sources.values()))
        self._compiled: dict[str, tuple[jinja2.Template, ContentFormat]] = {}
        self.special_tokens = dict(special_tokens or {})

    def _template(self, tools: object) -> tuple[str, jinja2.Template, ContentFormat]:
        name = "tool_use" if tools is not None and "tool_use" in self._sources else "default"
        source = self._sources.get(name)
        if source is None:
            raise PromptError("the model has no chat template (give models[].chat_template)")
        hit = self._compiled.get(name)
        if hit is None:
            try:
                hit = self._compiled[name] = (self._env.from_string(source), detect_content_format(source))
            except jinja2.TemplateError as exc:
                raise PromptError(f"the chat template does not compile: {exc}") from exc
        return source, hit[0], hit[1]

    def compile_all(self) -> None:
        """Compile now every template a request can select (``default``, ``tool_use``), so one that does not compile
        is an error at a process's start rather than a 400 on every request. Raises ``PromptError``."""
        for name, tools in (("default", None), ("tool_use", ())):
            if name in self._sources:
                try:
                    self._template(tools)
                except PromptError as exc:
                    raise PromptError(f"{exc} (template {name!r})") from exc

    def content_format(self, tools: object = None) -> ContentFormat:
        return self._template(tools)[2]

    def source(self, tools: object = None) -> str | None:
        """The template text a request with (``tools`` not None) or without tools renders with; None if none.
        vLLM probes it for behaviour a surface depends on (``kvstate.surfaces.template_traits``)."""
        return self._sources.get("tool_use" if tools is not None and "tool_use" in self._sources else "default")

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text vLLM's chat endpoint tokenizes for this request."""
        schemas = tool_schemas(tools)
        source, template, fmt = self._template(schemas)
        chat = conversation(messages, fmt)
        if any(m["role"] == "developer" for m in chat) and not _names_developer(source):
            chat = _system_first(chat)
        final = ""
        if continue_final_message:
            if add_generation_prompt:
                raise PromptError("cannot set both 'continue_final_message' and 'add_generation_prompt' to true")
            final = _mark_final_message(chat, source)
        scope: dict[str, Any] = {**self.special_tokens, **(template_kwargs or {})}
        for reserved in ("messages", "tools", "documents", "add_generation_prompt", "chat_template", "tokenize"):
            scope.pop(reserved, None)
        try:
            text = template.render(
                messages=chat, tools=schemas, documents=None, add_generation_prompt=add_generation_prompt, **scope
            )
        except jinja2.TemplateError as exc:
            raise PromptError(f"chat template failed: {exc}") from exc
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # A template indexing a field this request lacks: the engine answers 400 too.
            raise PromptError(f"chat template failed: {exc!r}") from exc
        return _cut_after_final_message(text, final) if continue_final_message else text


def _names_developer(source: str) -> bool:
    """vLLM's test of whether a template knows the ``developer`` role: it names it in quotes."""
    return '"developer"' in source or "'developer'" in source


def _system_first(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's answer to a ``developer`` message the template does not know (``renderers/hf.py``
    ``safe_apply_chat_template``): it becomes a ``system`` message (its ``tools`` dropped), and then every system
    message's text is merged, joined by a blank line, into one system message first, when one was not first or
    there were several."""
    converted: list[dict[str, Any]] = []
    for message in chat:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"} | {"role": "system"}
        converted.append(message)
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or i > 0 or bool(texts)
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                str(p["text"]) if isinstance(p, dict) else p
                for p in content
                if (isinstance(p, dict) and "text" in p) or isinstance(p, str)
            )
        if content:
            texts.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(texts)}, *others]


def _mark_final_message(chat: list[dict[str, Any]], source: str) -> str:
    """Tag the end of the last message's text, as transformers does before a ``continue_final_message`` render."""
    if not chat or chat[-1].get("content") is None:
        raise PromptError("continue_final_message is set but the final message has no content to continue")
    if "content" not in source:
        raise PromptError("continue_final_message is set but the chat template never prints 'content'")
    content = chat[-1]["content"]
    if isinstance(content, list):
        for block in reversed(content):
            if "text" in block:
                final = str(block["text"])
                block["text"] = final + _CONTINUE_TAG
                return final
        raise PromptError("continue_final_message is set but the final message has no text to continue")
    final = str(content)
    chat[-1]["content"] = final + _CONTINUE_TAG
    return final


def _cut_after_final_message(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise PromptError("continue_final_message is set but the template dropped part of the final message")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the message's trailing space: trim as transformers does


# -- files ----------------------------------------------------------------------------------------------------


def load_chat_template(tokenizer_path: Path, template_path: Path | None = None) -> ChatTemplate | None:
    """The chat template beside a ``tokenizer.json`` (or ``template_path``), with the special tokens of its config.

    Sources, first found wins, as vLLM resolves them: ``template_path`` (vLLM's ``--chat-template``), then
    ``chat_template.jinja`` beside the tokenizer, then ``tokenizer_config.json``'s ``chat_template`` (a string, or
    a list of named templates). The special tokens always come from ``tokenizer_config.json`` when it exists.
    None when there is no template at all.
    """
    config_path = tokenizer_path.parent / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.exists():
        try:
            loaded = json.loads(config_path.read_text())
        except ValueError as exc:
            raise PromptError(f"{config_path}: not valid JSON ({exc})") from exc
        config = loaded if isinstance(loaded, dict) else {}
    specials = special_tokens_map(config)
    if template_path is not None:
        return ChatTemplate(template_path.read_text(), specials)
    sibling = tokenizer_path.parent / "chat_template.jinja"
    if sibling.exists():
        return ChatTemplate(sibling.read_text(), specials)
    found = config.get("chat_template")
    if isinstance(found, str):
        return ChatTemplate(found, specials)
    if isinstance(found, list):
        named = {
            str(t["name"]): str(t["template"])
            for t in found
            if isinstance(t, Mapping) and "name" in t and "template" in t
        }
        return ChatTemplate(None, specials, named) if named else None
    return None
