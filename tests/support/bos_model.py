"""A model directory whose tokenizer adds a BOS and whose chat template prints ``bos_token`` and ``tools``.

SmolLM2's own files do neither (its post-processor adds nothing, its template names no special token), so the
rules that differ between chat and completions (who adds the BOS) would pass unnoticed on them. This variant is
SmolLM2's vocabulary with a Llama-style post-processor (``<|endoftext|>`` before every sequence) and a
Llama-3-style template: ``{{ bos_token }}`` first, tools as JSON in a system turn, ``eos_token`` closing turns.
"""

from __future__ import annotations

import json
from pathlib import Path

from cognitora_sim.tokenizer import SMOLLM2_DIR

BOS = "<|endoftext|>"
BOS_ID = 0
EOS = "<|im_end|>"

TEMPLATE = """{{- bos_token }}
{%- if tools %}<|im_start|>system
Tools you may call: {{ tools | tojson }}{{ eos_token }}
{% endif %}
{%- for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}
{%- if message.tool_calls %}{{ message.tool_calls | tojson }}{% endif %}{{ eos_token }}
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def write_bos_model(directory: Path) -> Path:
    """Write the model files into ``directory``; returns the ``tokenizer.json`` path."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = json.loads((SMOLLM2_DIR / "tokenizer.json").read_text())
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": BOS, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}},
    }
    (directory / "tokenizer.json").write_text(json.dumps(tok))
    config = {"bos_token": BOS, "eos_token": EOS, "unk_token": BOS, "pad_token": EOS}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "chat_template.jinja").write_text(TEMPLATE)
    return directory / "tokenizer.json"
