"""The model's chat template on /v1/chat/completions (engine backend): the text and the
token ids the server renders equal transformers' `apply_chat_template` (as vLLM renders
them), with add_generation_prompt, continue_final_message and chat_template_kwargs; the
template's own errors and bad fields are 400s; `--chat-template` overrides the folder's
template, and one that cannot be read is one line and exit 2."""

from __future__ import annotations

import json
import warnings

import httpx
import pytest
from chat_helpers import (
    CHATML,
    CONVERSATIONS,
    LLAMA3,
    OPTIONS,
    TEMPLATES,
    VOCAB,
    ZEPHYR,
    hf_render,
    trained_tokenizer,
    write_tokenizer,
)
from helpers import one_line_error
from srv_helpers import parse_sse, post, running_server
from transformers import AutoTokenizer

from llmsched.cli import build_parser
from llmsched.cli import server as server_cli
from llmsched.core.errors import ConfigError, InputWarning
from llmsched.engine.tokenizer import Tokenizer
from llmsched.server.backends import SchedulerOptions, _EngineTokenizer, make_engine_backend
from llmsched.server.chat_template import ChatTemplate, load_template_arg, resolve_template


@pytest.fixture(scope="module")
def trained():
    return trained_tokenizer()


def ours(folder, override=None):
    templates, note = resolve_template(folder, override)
    assert note is None and templates is not None
    return _EngineTokenizer(Tokenizer.from_dir(folder), templates)


def ours_lines(folder):
    """The engine's tokenizer of a folder whose templates it may not apply by default."""
    return _EngineTokenizer(Tokenizer.from_dir(folder), resolve_template(folder)[0])


def render(tok, msgs, agp, cfm, kwargs):
    opts = dict(add_generation_prompt=agp, continue_final_message=cfm, template_kwargs=kwargs)
    return tok.chat_text(msgs, **opts), tok.encode_chat(msgs, **opts)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_text_and_ids_equal_transformers(tmp_path, trained, name):
    folder = write_tokenizer(tmp_path / name, trained, TEMPLATES[name])
    hf = AutoTokenizer.from_pretrained(str(folder))
    tok = ours(folder)
    seen = set()
    refused = 0
    for msgs in CONVERSATIONS:
        for agp, cfm, kwargs in OPTIONS:
            try:
                want = hf_render(hf, msgs, agp, cfm, kwargs)
            except ValueError:  # a final message the template escapes cannot be continued
                with pytest.raises(ConfigError, match="does not appear"):
                    render(tok, msgs, agp, cfm, kwargs)
                refused += 1
                continue
            got = render(tok, msgs, agp, cfm, kwargs)
            assert got == want, (name, msgs, agp, cfm, kwargs)
            seen.add(got[0])
    assert refused == (1 if name == "features" else 0)  # tojson escapes conversation 2's quotes
    assert len(seen) >= 8  # the options change the text: the comparisons above are not vacuous
    # the template writes BOS (or none): the ids carry no BOS the template did not write
    text, ids = render(tok, CONVERSATIONS[0], True, False, None)
    assert ids.count(trained.token_to_id("<s>")) == text.count("<s>")


def test_what_the_options_do(tmp_path, trained):
    tok = ours(write_tokenizer(tmp_path / "t", trained, CHATML))
    haiku = CONVERSATIONS[3]
    opts = {"add_generation_prompt": False, "continue_final_message": True}
    cont = tok.chat_text(haiku, **opts)
    assert cont.endswith("<|im_start|>assistant\nAutumn moonlight -")  # the last message left open
    assert tok.chat_text(haiku).endswith("Autumn moonlight -<|im_end|>\n<|im_start|>assistant\n")
    assert tok.chat_text(haiku, add_generation_prompt=False).endswith("Autumn moonlight -<|im_end|>\n")
    thinking = tok.chat_text(haiku, template_kwargs={"enable_thinking": False})
    assert thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = tok.encode_chat(CONVERSATIONS[0])
    assert ids[0] == trained.token_to_id("<|im_start|>") and ids.count(trained.token_to_id("<|im_end|>")) == 2


def test_named_templates_and_the_jinja_file(tmp_path, trained):
    """A list of named templates: the one named default (as transformers); a
    chat_template.jinja file wins over tokenizer_config.json's (as transformers)."""
    named = [{"name": "tool_use", "template": ZEPHYR}, {"name": "default", "template": CHATML}]
    folder = write_tokenizer(tmp_path / "named", trained, named)
    hf = AutoTokenizer.from_pretrained(str(folder))
    for msgs in CONVERSATIONS:
        assert render(ours(folder), msgs, True, False, None) == hf_render(hf, msgs, True, False, None)
    assert "<|im_start|>" in ours(folder).chat_text(CONVERSATIONS[0])
    folder = write_tokenizer(tmp_path / "file", trained, ZEPHYR)
    (folder / "chat_template.jinja").write_text(LLAMA3)
    hf = AutoTokenizer.from_pretrained(str(folder))
    for msgs in CONVERSATIONS:
        assert render(ours(folder), msgs, True, False, None) == hf_render(hf, msgs, True, False, None)
    assert ours(folder).chat_text(CONVERSATIONS[0]).startswith("<s><|start_header_id|>user")
    # named templates without a default: not applied (but tool_use is, to requests with
    # tools: tests/server/test_chat_tools.py), and said so
    folder = write_tokenizer(tmp_path / "nodefault", trained, [{"name": "tool_use", "template": ZEPHYR}])
    templates, note = resolve_template(folder)
    assert templates.default is None and "none named 'default'" in note and "without tools" in note
    assert ours_lines(folder).chat_text(CONVERSATIONS[0]) == "user: Hello!\nassistant:"
    folder = write_tokenizer(tmp_path / "other", trained, [{"name": "rag", "template": ZEPHYR}])
    templates, note = resolve_template(folder)
    assert templates is None and "(rag) but none named 'default'" in note


def test_special_tokens_as_objects_and_from_the_map(tmp_path, trained):
    """tokenizer_config.json may give a special token as {"content": ...}; one it lacks
    comes from special_tokens_map.json (as transformers reads them)."""
    folder = write_tokenizer(tmp_path / "t", trained, "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["bos_token"] = {"content": "<s>", "lstrip": False, "__type": "AddedToken"}
    del cfg["eos_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": "</s>"}))
    hf = AutoTokenizer.from_pretrained(str(folder))
    assert render(ours(folder), CONVERSATIONS[0], True, False, None) == hf_render(
        hf, CONVERSATIONS[0], True, False, None
    )
    assert ours(folder).chat_text(CONVERSATIONS[0]) == "<s>|</s>|</s>"


def test_template_errors_are_config_errors_with_their_message(tmp_path, trained):
    tok = ours(write_tokenizer(tmp_path / "t", trained, CHATML))
    with pytest.raises(ConfigError, match="Only system, user and assistant roles are supported, got tool"):
        tok.chat_text([{"role": "tool", "content": "42"}])
    with pytest.raises(ConfigError, match="the chat template failed: TypeError"):
        tok.chat_text(CONVERSATIONS[0], template_kwargs={"shout": "hey"})
    with pytest.raises(ConfigError, match="cannot both be true"):
        tok.chat_text(CONVERSATIONS[0], add_generation_prompt=True, continue_final_message=True)
    # the sandbox: no way to Python internals
    evil = ChatTemplate("{{ messages.__class__.__mro__ }}", "test")
    with pytest.raises(ConfigError, match="the chat template failed"):
        evil.render(CONVERSATIONS[0])
    # a template that drops the final message cannot continue it
    with pytest.raises(ConfigError, match="does not appear"):
        ChatTemplate("{% for m in messages %}{{ m.role }}{% endfor %}{{ 'content' if false }}", "t").render(
            CONVERSATIONS[3], add_generation_prompt=False, continue_final_message=True
        )


def test_template_arguments(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}!")
    assert load_template_arg(str(f)) == ("{{ messages[0]['content'] }}!", f"--chat-template {f}")
    text, _ = load_template_arg("{% for m in messages %}{{ m.content }}\\n{% endfor %}")
    assert text == "{% for m in messages %}{{ m.content }}\n{% endfor %}"  # escapes decoded, as vLLM
    assert ChatTemplate(text, "t").render(CONVERSATIONS[1]) == "Be brief.\nWhat is 2+2?\n"
    assert load_template_arg("{{ '\u00e9\u6f22' }}")[0] == "{{ '\u00e9\u6f22' }}"  # non-ASCII kept
    with pytest.raises(ConfigError, match="no such file"):
        load_template_arg(str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match="is a folder"):
        load_template_arg(str(tmp_path))
    with pytest.raises(ConfigError, match=r"not a valid Jinja chat template: .*\(line 2\)"):
        ChatTemplate("ok\n{% for m in messages %}", "--chat-template x")
    long = "{{ 'x' }}" * 200  # too long for a file name: still a template
    assert load_template_arg(long)[0] == long


def test_without_a_template_the_role_lines_stay(tmp_path, trained):
    folder = write_tokenizer(tmp_path / "t", trained)
    template, note = resolve_template(folder)
    assert template is None and note is None
    tok = _EngineTokenizer(Tokenizer.from_dir(folder))
    msgs = CONVERSATIONS[0]
    assert tok.chat_text(msgs) == "user: Hello!\nassistant:"
    assert tok.chat_text(msgs, add_generation_prompt=False) == "user: Hello!"
    assert tok.encode_chat(msgs)[0] == trained.token_to_id("<s>")  # BOS added to the lines


# A template that loops over each message's content parts, as multimodal models' do (it
# shows each part's type, so parts and a joined string render differently).
PARTS = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{{ '(' + part['type'] + ')' + part['text'] }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SENT_PARTS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]},
    {"role": "assistant", "content": None},
    {"role": "user", "content": "A string"},
    {"role": "assistant", "content": [{"type": "text", "text": "Well -"}]},
]


def _as_vllm_passes(messages, as_parts: bool) -> list[dict]:
    """The messages as vLLM's `auto` content format hands them to a template: all contents
    as text parts for a template that loops over them, else as strings."""
    out = []
    for m in messages:
        c = m["content"]
        parts = [] if c is None else [{"type": "text", "text": c}] if isinstance(c, str) else c
        out.append({**m, "content": parts if as_parts else "\n".join(p["text"] for p in parts)})
    return out


@pytest.mark.parametrize(
    "template, as_parts",
    [
        (CHATML, False),
        (LLAMA3, False),
        (PARTS, True),
        # a loop over a name set from messages, the content filtered or sliced
        (
            "{% set rest = messages[1:] %}{% for m in rest %}{% for p in m.content | list %}{% endfor %}{% endfor %}",
            True,
        ),
        ("{% for m in messages %}{% for p in m['content'][:2] %}{{ p.text }}{% endfor %}{% endfor %}", True),
        # a macro's loop over its argument named content (Qwen3.5's style)
        ("{% macro show(content) %}{% for p in content %}{{ p.text }}{% endfor %}{% endmacro %}", True),
        # loops over other things' contents, or over a message's other fields: strings
        ("{% for d in documents %}{% for x in d.content %}{% endfor %}{% endfor %}{{ messages[0].content }}", False),
        ("{% for m in messages %}{% for c in m.tool_calls %}{% endfor %}{{ m.content }}{% endfor %}", False),
    ],
)
def test_the_content_format_is_detected_as_vllm_does(template, as_parts):
    assert ChatTemplate(template, "t").content_as_parts is as_parts


@pytest.mark.parametrize("template", [PARTS, CHATML])
def test_content_parts_reach_a_template_that_loops_over_them(tmp_path, trained, template):
    """Text parts stay parts for a template that loops over contents (strings become one
    part, none no part), else are joined by newlines: transformers' rendering of what vLLM
    hands the template, through the request parser, with continue_final_message too."""
    from llmsched.server.protocol import parse_chat

    folder = write_tokenizer(tmp_path / "t", trained, template)
    hf = AutoTokenizer.from_pretrained(str(folder))
    tok = ours(folder)
    as_parts = template is PARTS
    parsed = parse_chat({"model": "m", "messages": SENT_PARTS}).messages
    for agp, cfm in ((True, False), (False, True)):
        msgs = SENT_PARTS if cfm else SENT_PARTS[:-1]
        want = hf_render(hf, _as_vllm_passes(msgs, as_parts), agp, cfm, None)
        assert render(tok, parsed[: len(msgs)], agp, cfm, None) == want
    text = want[0]
    if as_parts:
        assert "(text)Two(text)parts<|im_end|>" in text and "(text)A string<|im_end|>" in text
        assert text.endswith("(text)Well -")
    else:
        assert "Two\nparts<|im_end|>" in text and "(text)" not in text
    assert parsed[-1]["content"] == SENT_PARTS[-1]["content"]  # continuing did not change the request's


# ---- the CLI: --chat-template, and templates that cannot be used -------------------------


def _one_line_error(capsys, argv, *words):
    one_line_error(capsys, argv, "llmsched serve: error:", *words)


def test_a_template_that_cannot_be_used_is_one_line_and_exit_2(tmp_path, trained, capsys):
    """Found before the model loads (the folder holds no model at all)."""
    folder = write_tokenizer(tmp_path / "m", trained)
    serve = ["serve", "--model", str(folder), "--port", "0"]
    missing = tmp_path / "missing.jinja"
    _one_line_error(capsys, [*serve, "--chat-template", str(missing)], "--chat-template", "no such file")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    _one_line_error(capsys, [*serve, "--chat-template", str(bad)], str(bad), "not a valid Jinja chat template")
    _one_line_error(capsys, [*serve, "--chat-template", "{{ oops"], "not a valid Jinja chat template")
    sim = ["serve", "--backend", "sim", "--port", "0"]
    _one_line_error(capsys, [*sim, "--chat-template", str(bad)], "--chat-template needs --tokenizer")
    _one_line_error(capsys, [*sim, "--tokenizer", str(folder), "--chat-template", str(bad)], "not a valid Jinja")
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    _one_line_error(capsys, ["serve", "--model", str(empty), "--port", "0", "--chat-template", "{{ 1 }}"], "tokenizer")
    write_tokenizer(folder, trained, "{% if %}")  # the folder's own template does not parse
    _one_line_error(capsys, serve, "tokenizer_config.json", "not a valid Jinja chat template")


# ---- end to end: the engine backend over HTTP --------------------------------------------


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, trained):
    """A tiny model whose tokenizer has ChatML's markers and the CHATML template."""
    from llmsched.engine import make_tiny_model

    model = make_tiny_model(
        tmp_path_factory.mktemp("chat") / "m",
        vocab_size=VOCAB,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
    )
    return write_tokenizer(model, trained, CHATML)


ENGINE = {"max_model_len": 256, "num_blocks": 64, "block_size": 16, "seed": 0}


@pytest.fixture(scope="module")
def served(chat_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)  # an applied template: no warning
        backend = make_engine_backend(str(chat_model), SchedulerOptions(b_max=256, max_running=8), **ENGINE)
    with running_server(backend) as (base, _):
        yield base, backend, AutoTokenizer.from_pretrained(str(chat_model))


def test_http_chat_uses_the_template(served):
    base, backend, hf = served
    name = backend.model_name
    msgs = CONVERSATIONS[2]
    _, want = hf_render(hf, msgs, True, False, None)
    body = {"model": name, "messages": msgs, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    r = post(base, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(want)
    # the engine got exactly those ids: greedy text equals a completion of the same ids
    c = post(base, "/v1/completions", {**body, "prompt": want, "messages": None})
    assert c.status_code == 200, c.text
    assert r.json()["choices"][0]["message"]["content"] == c.json()["choices"][0]["text"]
    # streamed, with usage
    s = post(base, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    ev = parse_sse(s.content)
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant" and ev[-1] == "[DONE]"
    assert ev[-2]["usage"]["prompt_tokens"] == len(want)
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in ev[:-1] if e["choices"])
    assert streamed == c.json()["choices"][0]["text"]
    assert httpx.get(base + "/version").json()["chat_template"].endswith("tokenizer_config.json (chat_template)")


@pytest.mark.parametrize("agp, cfm, kwargs", OPTIONS)
def test_http_options_and_tokenize_equal_transformers(served, agp, cfm, kwargs):
    base, backend, hf = served
    msgs = CONVERSATIONS[3]
    _, want = hf_render(hf, msgs, agp, cfm, kwargs)
    extra = {"add_generation_prompt": agp, "continue_final_message": cfm}
    if kwargs is not None:
        extra["chat_template_kwargs"] = kwargs
    t = post(base, "/tokenize", {"messages": msgs, **extra})
    assert t.status_code == 200, t.text
    assert t.json()["tokens"] == want and t.json()["count"] == len(want)
    body = {"model": backend.model_name, "messages": msgs, "max_tokens": 2, "temperature": 0, **extra}
    r = post(base, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(want)
    # the kwargs' spelling of the two flags replaces the fields' (as vLLM)
    moved = {"chat_template_kwargs": {**(kwargs or {}), "add_generation_prompt": agp, "continue_final_message": cfm}}
    assert post(base, "/tokenize", {"messages": msgs, **moved}).json()["tokens"] == want


def test_http_tokenize_counts_as_the_chat_route(served):
    """No BOS on top of the template's text, unless add_special_tokens asks for it."""
    base, backend, hf = served
    msgs = CONVERSATIONS[0]
    _, want = hf_render(hf, msgs, True, False, None)
    assert post(base, "/tokenize", {"messages": msgs}).json()["tokens"] == want
    bos = hf.convert_tokens_to_ids("<s>")
    got = post(base, "/tokenize", {"messages": msgs, "add_special_tokens": True}).json()["tokens"]
    assert got == [bos, *want]


def test_http_the_context_limit_counts_the_templates_tokens(served):
    base, backend, hf = served
    msgs = [{"role": "user", "content": "The scheduler decides. " * 10}]
    _, want = hf_render(hf, msgs, True, False, None)
    assert 150 < len(want) < 256
    # max_tokens is cut to the room the rendered prompt leaves (as vLLM's get_max_tokens)
    body = {"model": backend.model_name, "messages": msgs, "max_tokens": 200, "ignore_eos": True}
    r = post(base, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": len(want), "completion_tokens": 256 - len(want), "total_tokens": 256}
    assert r.json()["choices"][0]["finish_reason"] == "length"
    long = [{"role": "user", "content": "The scheduler decides. " * 20}]
    r = post(base, "/v1/chat/completions", {"model": backend.model_name, "messages": long, "max_tokens": 1})
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    assert f"your prompt has {len(hf_render(hf, long, True, False, None)[1])} tokens" in err["message"], err


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"add_generation_prompt": "maybe"}, "add_generation_prompt", "must be a boolean"),
        ({"continue_final_message": 0.5}, "continue_final_message", "must be a boolean"),
        ({"continue_final_message": True}, "continue_final_message", "cannot both be true"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "must be an object"),
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs", "must be an object"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "cannot set 'messages'"),
        ({"chat_template_kwargs": {"add_generation_prompt": "no"}}, "chat_template_kwargs", "must be a boolean"),
        (
            {"chat_template_kwargs": {"continue_final_message": True}},
            "continue_final_message",
            "cannot both be true",
        ),
        ({"chat_template": "{{ 1 }}"}, "chat_template", "not supported"),
        ({"chat_template_kwargs": {"shout": "hey"}}, "messages", "the chat template failed: TypeError"),
        (
            {"messages": [{"role": "tool", "content": "42"}]},
            "messages",
            "Only system, user and assistant roles are supported, got tool",
        ),
    ],
)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/chat/completions stream", "/tokenize"])
def test_http_bad_options_and_template_errors_are_400s(served, extra, param, words, route):
    base, backend, _ = served
    body = {"model": backend.model_name, "messages": CONVERSATIONS[0], "max_tokens": 2, **extra}
    if route.endswith("stream"):
        body["stream"] = True
    r = post(base, route.split()[0], body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_chat_template_option_overrides_the_folders(chat_model, tmp_path):
    """--chat-template, a file or the template itself, replaces the folder's template, in
    make_engine_backend and on the command line."""
    f = tmp_path / "zephyr.jinja"
    f.write_text(ZEPHYR)
    hf = AutoTokenizer.from_pretrained(str(chat_model))
    msgs = CONVERSATIONS[1]
    _, want = hf_render(hf, msgs, True, False, None, chat_template=ZEPHYR)
    for override in (str(f), ZEPHYR.replace("\n", "\\n")):
        backend = make_engine_backend(
            str(chat_model), SchedulerOptions(b_max=64, max_running=2), chat_template=override, **ENGINE
        )
        assert backend.tokenizer.encode_chat(msgs) == want
    argv = ["serve", "--model", str(chat_model), "--chat-template", str(f), "--max-model-len", "256"]
    backend = server_cli.build_backend(
        build_parser("serve").parse_args([*argv, "--num-blocks", "64", "--max-running", "4"])
    )
    assert backend.tokenizer.templates.source == f"--chat-template {f}"
    with running_server(backend) as (base, _):
        assert post(base, "/tokenize", {"messages": msgs}).json()["tokens"] == want
        r = post(base, "/v1/chat/completions", {"model": backend.model_name, "messages": msgs, "max_tokens": 1})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want)
