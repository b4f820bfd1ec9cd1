"""Chat templates on the sim backend (`--tokenizer DIR`, `--chat-template`): the same text
and ids as transformers' `apply_chat_template` and as the engine backend's tokenizer; and
the message fields beyond role and content (`name`, `tool_calls`, `tool_call_id`, text
parts) and the request's `tools` reach the template as vLLM passes them, with the named
`tool_use` template for requests with tools; bad types are 400s."""

from __future__ import annotations

import copy
import json
import math
import pathlib

import httpx
import pytest
from chat_helpers import (
    CHATML,
    CONVERSATIONS,
    OPTIONS,
    TEMPLATES,
    ZEPHYR,
    hf_render,
    trained_tokenizer,
    write_tokenizer,
)
from srv_helpers import post, running_server
from transformers import AutoTokenizer

from llmsched.cli import build_parser
from llmsched.cli import server as server_cli
from llmsched.engine.tokenizer import Tokenizer
from llmsched.server.backends import SchedulerOptions, _EngineTokenizer, make_sim_backend
from llmsched.server.chat_template import content_text, resolve_template
from llmsched.server.protocol import APIError, parse_chat

MODEL = "llmsched-sim"

# A tool-use template in the style of real ones (Hermes, Qwen): the tools first, then each
# message with its name, its tool calls (arguments as an object) and the call it answers.
TOOLS_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\nTools:\n' }}
{%- for tool in tools %}
{{- tool.function.name + ': ' + (tool.function.description or '') + ' ' + (tool.function.parameters | tojson) + '\n' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{{- '<|im_start|>' + message.role }}
{%- if message.name is defined %}{{ ' (' + message.name + ')' }}{% endif %}
{{- '\n' }}
{%- if message.role == 'tool' %}{{ '[for ' + message.tool_call_id + '] ' }}{% endif %}
{{- message.content }}
{%- for call in message.tool_calls or [] %}
{{- '\n<tool_call>' + call.function.name + ' ' + (call.function.arguments | tojson) }}
{%- if call.function.arguments.city is defined %}{{ ' city=' + call.function.arguments.city }}{% endif %}
{{- '</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]

# a conversation as an OpenAI client sends it ...
SENT = [
    {"role": "system", "content": "You route questions.", "name": "router"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "text", "text": "And in Rome."}],
        "name": "alice",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "C"}'},
            },
        ],
    },
    {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    {"role": "tool", "content": [{"type": "text", "text": "21 C"}], "tool_call_id": "call_2", "name": "get_weather"},
]
# ... and as vLLM hands it to a template that does not loop over contents: text parts
# joined, no content is '', the arguments' JSON parsed
PASSED = [
    {"role": "system", "content": "You route questions.", "name": "router"},
    {"role": "user", "content": "Weather in Paris?\nAnd in Rome.", "name": "alice"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}},
            },
        ],
    },
    {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    {"role": "tool", "content": "21 C", "tool_call_id": "call_2", "name": "get_weather"},
]


@pytest.fixture(scope="module")
def trained():
    return trained_tokenizer()


def sim(folder, **kw):
    return make_sim_backend(SchedulerOptions(max_running=8), "const:1", tokenizer=str(folder), **kw)


def chat_of(body: dict) -> dict:
    return parse_chat({"model": MODEL, **body}).chat_options


def test_the_sim_renders_as_transformers_and_the_engine(tmp_path, trained):
    """Every template, conversation and option: the sim backend's text and ids are
    transformers' and the engine backend's tokenizer's on the same folder."""
    seen = set()
    for name, template in TEMPLATES.items():
        folder = write_tokenizer(tmp_path / name, trained, template)
        hf = AutoTokenizer.from_pretrained(str(folder))
        tok = sim(folder).tokenizer
        engine = _EngineTokenizer(Tokenizer.from_dir(folder), resolve_template(folder)[0])
        for msgs in CONVERSATIONS:
            for agp, cfm, kwargs in OPTIONS:
                opts = dict(add_generation_prompt=agp, continue_final_message=cfm, template_kwargs=kwargs)
                try:
                    want = hf_render(hf, msgs, agp, cfm, kwargs)
                except ValueError:  # a final message the template escapes cannot be continued
                    continue
                got = (tok.chat_text(msgs, **opts), tok.encode_chat(msgs, **opts))
                assert got == want, (name, msgs, agp, cfm, kwargs)
                assert got == (engine.chat_text(msgs, **opts), engine.encode_chat(msgs, **opts))
                seen.add(got[0])
    assert len(seen) >= 30  # templates and options change the text: the comparisons are not vacuous


def test_without_a_template_the_sim_renders_lines_as_the_engine(tmp_path, trained):
    """A folder without a chat template: `role: content` lines, tokenized with BOS, as the
    engine backend does; named templates without a default: the same, and a warning."""
    folder = write_tokenizer(tmp_path / "plain", trained)
    tok = sim(folder).tokenizer
    engine = _EngineTokenizer(Tokenizer.from_dir(folder))
    msgs = CONVERSATIONS[1]
    assert tok.chat_text(msgs) == "system: Be brief.\nuser: What is 2+2?\nassistant:"
    ids = tok.encode_chat(msgs)
    assert ids == engine.encode_chat(msgs) and ids[0] == trained.token_to_id("<s>")
    assert tok.encode(tok.chat_text(msgs)) == ids[1:]  # completions on the sim: no BOS, as before
    folder = write_tokenizer(tmp_path / "named", trained, [{"name": "rag", "template": CHATML}])
    with pytest.warns(Warning, match="none named 'default'"):
        tok = sim(folder).tokenizer
    assert tok.chat_text(msgs) == "system: Be brief.\nuser: What is 2+2?\nassistant:"


def test_the_sim_over_http_and_its_chat_template_option(tmp_path, trained):
    """/v1/chat/completions counts the template's tokens (usage, as transformers), /tokenize
    gives them, /version names the template; `--chat-template` replaces it (CLI too)."""
    folder = write_tokenizer(tmp_path / "t", trained, CHATML)
    hf = AutoTokenizer.from_pretrained(str(folder))
    msgs = CONVERSATIONS[2]
    _, want = hf_render(hf, msgs, True, False, None)
    with running_server(sim(folder)) as (base, _):
        r = post(base, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want), r.text
        assert post(base, "/tokenize", {"messages": msgs}).json()["tokens"] == want
        assert httpx.get(base + "/version").json()["chat_template"].endswith("tokenizer_config.json (chat_template)")
        bad = {"model": MODEL, "messages": [{"role": "tool", "content": "42"}], "max_tokens": 3}
        r = post(base, "/v1/chat/completions", bad)
        assert r.status_code == 400 and "got tool" in r.json()["error"]["message"]
    f = tmp_path / "zephyr.jinja"
    f.write_text(ZEPHYR)
    _, zephyr = hf_render(hf, msgs, True, False, None, chat_template=ZEPHYR)
    assert zephyr != want
    assert sim(folder, chat_template=str(f)).tokenizer.encode_chat(msgs) == zephyr
    args = ["serve", "--backend", "sim", "--tokenizer", str(folder), "--chat-template", str(f)]
    backend = server_cli.build_backend(build_parser("serve").parse_args(args))
    assert backend.info["chat_template"] == f"--chat-template {f}"
    with running_server(backend) as (base, _):
        r = post(base, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(zephyr)


def test_message_fields_reach_the_template_as_vllm_passes_them():
    opts = chat_of({"messages": SENT, "tools": TOOLS, "tool_choice": "none"})
    parsed = parse_chat({"model": MODEL, "messages": SENT}).messages
    # the parts stay parts (the template decides: see test_chat_template.py), no content none
    assert parsed[1]["content"] == SENT[1]["content"] and parsed[2]["content"] == []
    assert [{**m, "content": content_text(m["content"])} for m in parsed] == PASSED
    assert opts["tools"] == TOOLS
    # fields the template is not given: dropped (as vLLM); an empty tool_calls list too
    odd = [
        {"role": "user", "content": "x", "refusal": None, "audio": {"id": "a"}},
        {"role": "assistant", "content": "y", "tool_calls": []},
    ]
    assert parse_chat({"model": MODEL, "messages": odd}).messages == [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
    ]
    # tool calls outside assistant messages, a call id outside tool messages: dropped (as vLLM)
    stray = [
        {"role": "user", "content": "x", "tool_calls": SENT[2]["tool_calls"]},
        {"role": "assistant", "content": "y", "tool_call_id": "call_1"},
    ]
    assert parse_chat({"model": MODEL, "messages": stray}).messages == [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
    ]
    # an assistant's reasoning reaches the template under both of vLLM's names
    for key in ("reasoning", "reasoning_content"):
        thought = {"role": "assistant", "content": "y", key: "hmm"}
        assert parse_chat({"model": MODEL, "messages": [thought]}).messages == [
            {"role": "assistant", "content": "y", "reasoning": "hmm", "reasoning_content": "hmm"}
        ]
    # arguments: a JSON object's text is parsed; an object is kept; none, a text that is not
    # JSON, or JSON that is not an object is {} (as vLLM)
    cases = (('{"a": [1, 2]}', {"a": [1, 2]}), ({"b": 1}, {"b": 1}), ("", {}), ("{oops", {}))
    cases += tuple((text, {}) for text in ("42", "[1, 2]", "null", "true", '"x"'))
    for arguments, passed in cases:
        call = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]}
        got = parse_chat({"model": MODEL, "messages": [call]}).messages[0]["tool_calls"]
        assert got == [{"function": {"name": "f", "arguments": passed}}]


@pytest.fixture(scope="module")
def tools_folder(tmp_path_factory, trained):
    return write_tokenizer(tmp_path_factory.mktemp("tools") / "t", trained, TOOLS_TEMPLATE)


@pytest.mark.parametrize("agp", [True, False])
def test_names_tool_calls_and_tools_render_as_transformers(tools_folder, agp):
    hf = AutoTokenizer.from_pretrained(str(tools_folder))
    tok = sim(tools_folder).tokenizer
    opts = chat_of({"messages": SENT, "tools": TOOLS, "tool_choice": "none", "add_generation_prompt": agp})
    text, ids = hf_render(hf, PASSED, agp, False, None, tools=TOOLS)
    parsed = parse_chat({"model": MODEL, "messages": SENT}).messages
    assert tok.chat_text(parsed, **opts) == text and tok.encode_chat(parsed, **opts) == ids
    for shown in (
        "<|im_start|>system (router)\n",
        "<|im_start|>user (alice)\nWeather in Paris?\nAnd in Rome.",
        'get_weather: The weather in a city {"type": "object", "properties": {"city"',
        "now:  {",
        '<tool_call>get_weather {"city": "Rome", "unit": "C"} city=Rome</tool_call>',
        "<|im_start|>tool (get_weather)\n[for call_2] 21 C",
    ):
        assert shown in text, shown
    no_tools = chat_of({"messages": SENT})
    assert "Tools:" not in tok.chat_text(PASSED, **no_tools)
    assert tok.chat_text(PASSED, **no_tools) == hf_render(hf, PASSED, True, False, None)[0]


def test_an_explicit_null_tool_choice_is_none():
    """vLLM takes "auto" only when tool_choice is absent; a null one renders the tools."""
    body = {"model": MODEL, "messages": SENT, "tools": TOOLS}
    assert parse_chat({**body, "tool_choice": None}).tools == TOOLS
    with pytest.raises(APIError, match="needs a tool-call parser"):
        parse_chat(body)


def test_tools_over_http(tools_folder):
    """The chat route (with tool_choice "none") and /tokenize (which needs none) count
    transformers' tokens; tools given as chat_template_kwargs render the same."""
    hf = AutoTokenizer.from_pretrained(str(tools_folder))
    _, want = hf_render(hf, PASSED, True, False, None, tools=TOOLS)
    body = {"model": MODEL, "messages": SENT, "tools": TOOLS, "tool_choice": "none", "max_tokens": 2}
    with running_server(sim(tools_folder)) as (base, _):
        r = post(base, "/v1/chat/completions", body)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want), r.text
        r = post(base, "/v1/chat/completions", {**body, "stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert post(base, "/tokenize", {"messages": SENT, "tools": TOOLS}).json()["tokens"] == want
        moved = {"messages": SENT, "chat_template_kwargs": {"tools": TOOLS}}
        assert post(base, "/tokenize", moved).json()["tokens"] == want
        plain = post(base, "/tokenize", {"messages": SENT}).json()["tokens"]
        assert plain == hf_render(hf, PASSED, True, False, None)[1] and len(plain) < len(want)


TOOL_USE = "{{ 'TOOL_USE ' + (tools | length | string) }}{% for m in messages %}|{{ m.content }}{% endfor %}"


@pytest.mark.parametrize("layout", ["config list", "template files"])
def test_the_tool_use_template_renders_requests_with_tools(tmp_path, trained, layout):
    """Named templates (tokenizer_config.json's list, or chat_template.jinja with
    additional_chat_templates/): 'tool_use' for requests with tools, 'default' otherwise,
    as transformers picks them."""
    if layout == "config list":
        named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOL_USE}]
        folder = write_tokenizer(tmp_path / "t", trained, named)
    else:
        folder = write_tokenizer(tmp_path / "t", trained)
        (folder / "chat_template.jinja").write_text(CHATML)
        (folder / "additional_chat_templates").mkdir()
        (folder / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_USE)
    hf = AutoTokenizer.from_pretrained(str(folder))
    backend = sim(folder)
    tok = backend.tokenizer
    msgs = CONVERSATIONS[1]
    with_tools = hf_render(hf, msgs, True, False, None, tools=TOOLS)
    assert with_tools[0] == "TOOL_USE 2|Be brief.|What is 2+2?"
    assert (tok.chat_text(msgs, tools=TOOLS), tok.encode_chat(msgs, tools=TOOLS)) == with_tools
    plain = hf_render(hf, msgs, True, False, None)
    assert plain[0].startswith("<|im_start|>system\nBe brief.")
    assert (tok.chat_text(msgs), tok.encode_chat(msgs)) == plain
    assert backend.info["chat_template_tool_use"].endswith(
        "(chat_template 'tool_use')" if layout == "config list" else "tool_use.jinja"
    )


def test_the_folder_is_read_once(tmp_path, trained, monkeypatch):
    folder = write_tokenizer(tmp_path / "t", trained, CHATML, pad_token="<pad>")
    reads = []
    read_text = pathlib.Path.read_text

    def counted(self, *a, **kw):
        reads.append(self.name)
        return read_text(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "read_text", counted)
    templates, _ = resolve_template(folder)
    assert templates.default.tokens["pad_token"] == "<pad>"
    assert reads.count("tokenizer_config.json") == 1 and "special_tokens_map.json" in reads
    reads.clear()
    resolve_template(folder, "{{ 1 }}")  # an override: the folder's template is not read
    assert reads == ["tokenizer_config.json", "special_tokens_map.json"]


def test_without_a_tokenizer_the_sim_counts_contents(tmp_path):
    """The byte rule counts the messages' contents joined by newlines: names, tool calls and
    tools are accepted and not counted. --chat-template needs --tokenizer."""
    contents = "\n".join(m["content"] for m in PASSED)
    body = {"model": MODEL, "messages": SENT, "tools": TOOLS, "tool_choice": "none", "max_tokens": 2}
    with running_server() as (base, _):
        r = post(base, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == math.ceil(len(contents.encode()) / 4)
    with pytest.raises(Exception, match="--chat-template needs --tokenizer"):
        make_sim_backend(chat_template="{{ 1 }}")


def _with(path, value):
    """SENT with the field at `path` (message index, then keys) set to `value`."""
    msgs = copy.deepcopy(SENT)
    at = msgs
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return msgs


BAD = [  # (body fields, param, words of the message)
    ({"messages": _with((0, "name"), 5)}, "messages[0].name", "must be a string"),
    ({"messages": _with((2, "tool_calls"), "call")}, "messages[2].tool_calls", "must be an array"),
    ({"messages": _with((2, "tool_calls", 0), 5)}, "messages[2].tool_calls", "must be a tool call"),
    ({"messages": _with((2, "tool_calls", 0, "function"), "f")}, "messages[2].tool_calls", "must be a tool call"),
    ({"messages": _with((2, "tool_calls", 0, "id"), 7)}, "messages[2].tool_calls", "[0].id' must be a string"),
    ({"messages": _with((2, "tool_calls", 1, "type"), "code")}, "messages[2].tool_calls", "[1].type' must be"),
    (
        {"messages": _with((2, "tool_calls", 0, "function", "name"), None)},
        "messages[2].tool_calls",
        "function.name' must be a string",
    ),
    (
        {"messages": _with((2, "tool_calls", 0, "function", "arguments"), 3)},
        "messages[2].tool_calls",
        "function.arguments' must be a JSON text",
    ),
    ({"messages": _with((3, "tool_call_id"), 1)}, "messages[3].tool_call_id", "must be a string"),
    ({"messages": _with((2, "reasoning"), ["a"])}, "messages[2].reasoning", "must be a string"),
    ({"tools": []}, "tools", "non-empty array"),
    ({"tools": {"function": {"name": "f"}}}, "tools", "non-empty array"),
    ({"tools": [TOOLS[0], "now"]}, "tools", "'tools[1]' must be a tool"),
    ({"tools": [{"type": "function"}]}, "tools", "'tools[0]' must be a tool"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools", "type' must be 'function'"),
    ({"tools": [{"function": {"name": ""}}]}, "tools", "function.name' must be a non-empty string"),
    ({"tools": [{"function": {"name": "f", "description": 5}}]}, "tools", "description' must be a string"),
    ({"tools": [{"function": {"name": "f", "parameters": "{}"}}]}, "tools", "parameters' must be an object"),
    ({"chat_template_kwargs": {"tools": TOOLS}}, "chat_template_kwargs", "cannot set 'tools'"),
    # the rest of function calling, and what else the server refuses
    ({"functions": [TOOLS[0]["function"]]}, "functions", "not supported"),
    ({"function_call": "auto"}, "function_call", "not supported"),
    ({"guided_json": {"type": "object"}}, "guided_json", "not supported"),
    ({"guided_regex": "a+"}, "guided_json", "not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content",
        "must be a text part",
    ),
]
GENERATING_ONLY = [  # /tokenize does not look at tool_choice
    ({"tool_choice": None}, "tool_choice", "needs a tool-call parser"),
    ({"tool_choice": "auto"}, "tool_choice", "needs a tool-call parser"),
    ({"tool_choice": "required"}, "tool_choice", "not supported"),
    ({"tool_choice": {"type": "function", "function": {"name": "now"}}}, "tool_choice", "not supported"),
    ({"tools": None, "tool_choice": "auto"}, "tool_choice", "needs a tool-call parser"),
]


@pytest.fixture(scope="module")
def tools_server(tools_folder):
    with running_server(sim(tools_folder)) as (base, _):
        yield base


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
@pytest.mark.parametrize("extra, param, words", BAD + GENERATING_ONLY)
def test_bad_field_types_are_400s(tools_server, route, extra, param, words):
    body = {"model": MODEL, "messages": SENT, "tools": TOOLS, "tool_choice": "none", "max_tokens": 2, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    r = post(tools_server, route, body)
    if route == "/tokenize" and (extra, param, words) in GENERATING_ONLY:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"], err
    with pytest.raises(APIError):  # the parser alone says the same
        parse_chat(json.loads(json.dumps(body)), tokenize_only=route == "/tokenize")
