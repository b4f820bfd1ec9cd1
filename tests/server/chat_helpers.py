"""What the chat-template tests share: a tiny tokenizer with ChatML's markers, templates
in the styles of real models', conversations, and transformers' rendering to compare with."""

from __future__ import annotations

import json

from llmsched.engine.tiny import train_tokenizer

IM = ["<|im_start|>", "<|im_end|>"]  # ChatML's markers: special tokens of the test tokenizer
VOCAB = 300  # 298 trained + the two markers (the tiny model's vocabulary)

# Templates written for these tests, in the styles of real models' templates.
CHATML = (  # Qwen-style: a default system prompt, an enable_thinking kwarg, raise_exception
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Only system, user and assistant roles are supported, got ' + message['role']) }}"
    "{% endif %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if shout is defined %}{{ shout + 1 }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
LLAMA3 = (  # Llama-3-style: BOS from the template, trimmed contents
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
FEATURES = """{%- set ns = namespace(system='', turns=0) -%}
{{- bos_token -}}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{%- set ns.system = m.content -%}{%- continue -%}{%- endif -%}
    {%- set ns.turns = ns.turns + 1 -%}
    {%- if ns.turns > 20 -%}{%- break -%}{%- endif -%}
    [{{ m.role }}] {{ dict(text=m.content, turn=ns.turns) | tojson }}
{% endfor -%}
{%- if ns.system %}(system: {{ ns.system }}){% endif -%}
{%- generation %}{% if add_generation_prompt %}[assistant]{% endif %}{% endgeneration -%}"""
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "zephyr": ZEPHYR, "features": FEATURES}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello, how can I help?"},
        {
            "role": "user",
            "content": 'Tell me <b>more</b> & "quote" - \u00fcn\u00efc\u00f8d\u00e9 \u6f22\u5b57\n  indented  ',
        },
    ],
    [{"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn moonlight -"}],
]
OPTIONS = [  # (add_generation_prompt, continue_final_message, chat_template_kwargs)
    (True, False, None),
    (False, False, None),
    (False, True, None),
    (True, False, {"enable_thinking": False}),
]


def trained_tokenizer():
    """The test tokenizer: a trained byte-level BPE, BOS <s> added by its post-processor,
    and ChatML's markers as special tokens."""
    tok = train_tokenizer(VOCAB - len(IM))
    tok.add_special_tokens(IM)
    assert tok.get_vocab_size() == VOCAB
    return tok


def write_tokenizer(folder, tok, template=None, **config):
    """A tokenizer folder as a model's: tokenizer.json and tokenizer_config.json (BOS, EOS and
    the chat template)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", **config}
    if template is not None:
        cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def hf_render(hf, msgs, agp, cfm, kwargs, **extra):
    """transformers' (text, token ids) of a conversation."""
    opts = dict(add_generation_prompt=agp, continue_final_message=cfm, **(kwargs or {}), **extra)
    text = hf.apply_chat_template(msgs, tokenize=False, **opts)
    out = hf.apply_chat_template(msgs, tokenize=True, **opts)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return text, list(ids)
