"""OpenAI request parsing and validation, response bodies and SSE framing.

Requests are parsed from the raw JSON body by hand (no pydantic on the hot path) so that
every mistake becomes an OpenAI-style error naming the offending parameter:
`{"error": {"message", "type", "param", "code"}}`. Unknown fields are ignored, as vLLM
does. Fields we accept work (`n`, several prompts, `echo`, `logprobs` (with `echo`: the
prompt's too), `max_tokens: 0` with `echo`, `logit_bias`, the penalties, chat's `echo`,
`add_generation_prompt` / `continue_final_message` / `chat_template_kwargs`, messages'
`name` / `tool_calls` / `tool_call_id` and `tools` with `tool_choice: "none"`, which reach
the chat template as vLLM passes them; see docs/serving.md for what the sim backend does
with them); what is not supported (JSON mode `response_format`, tool-call parsing
(`tool_choice` other than `"none"`), `functions`, `suffix`, `best_of` other than `n`, and
vLLM's fields in `_NOT_HONOURED`: guided decoding, beam search, min-p, priority, ...) is a 400 that
says so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from ..core.engine_api import INT64_MAX, INT64_MIN, MAX_LOGPROBS, MAX_STOP_CHARS, SamplingParams
from .chat_template import content_text

try:  # orjson is optional: it makes the SSE hot path a little cheaper
    import orjson as _orjson

    def dumps(obj) -> str:
        return _orjson.dumps(obj).decode()

    def loads(data):
        return _orjson.loads(data)
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None
    _enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

    def dumps(obj) -> str:
        return _enc.encode(obj)

    def loads(data):
        return json.loads(data)


class APIError(Exception):
    """An error returned to the client as an OpenAI-style JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


# ---- field checks -------------------------------------------------------------------
def _show(v, limit: int = 80) -> str:
    """repr(v) for an error message, clipped: never echo a long client value back whole."""
    if isinstance(v, (list, dict)) and len(v) > 8:
        return f"<{_type_name(v)} of {len(v)} items>"
    if isinstance(v, str) and len(v) > limit:
        return repr(v[:limit]) + "..."
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def _show_number(v) -> str:
    """An integer as written (its first digits and its length when long), a float as %g."""
    if isinstance(v, float):
        return f"{v:g}"
    digits = str(v)
    return digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits.lstrip('-'))} digits)"


def _type_name(v) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(v), type(v).__name__)


# pydantic's lax mode, in which vLLM reads request bodies, takes a number written as a
# string: an integer field a string of digits (with a sign, underscores between digits,
# surrounding whitespace, or a fraction of zeros: "16.0"), a number field any string
# Python's float() reads ("0.5", "1e-3"); see _bool for booleans
_INT_TEXT = re.compile(r"([+-]?[0-9](?:_?[0-9])*)(?:\.0+)?", re.ASCII)


def _lax_int(v, key: str):
    """`v`, or the integer a string `v` writes (see _INT_TEXT)."""
    if isinstance(v, str) and (m := _INT_TEXT.fullmatch(v.strip())):
        try:
            return int(m[1])
        except ValueError:  # more digits than Python converts: far beyond 64 bits
            raise bad_request(f"'{key}' must be a 64-bit integer, got {_show(v)}", key) from None
    return v


def _lax_float(v):
    """`v`, or the number a string `v` writes (see _INT_TEXT; "nan" too, for the caller to refuse)."""
    if isinstance(v, str) and v.isascii():
        try:
            return float(v)
        except ValueError:
            pass
    return v


def _int(body: dict, key: str, default, minimum: int | None = None):
    v = body.get(key, default)
    if v is None:
        return default
    v = _lax_int(v, key)
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
        raise bad_request(f"'{key}' must be an integer, got {_type_name(v)} {_show(v)}", key)
    if not INT64_MIN <= v <= INT64_MAX:
        # no field means anything beyond 64 bits; and later messages would echo all its digits
        raise bad_request(f"'{key}' must be a 64-bit integer, got {_show_number(v)}", key)
    v = int(v)
    if minimum is not None and v < minimum:
        raise bad_request(f"'{key}' must be at least {minimum}, got {v}", key)
    return v


def _float(body: dict, key: str, default, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    v = raw = body.get(key, default)
    if v is None:
        return default
    v = _lax_float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"'{key}' must be a number, got {_type_name(raw)} {_show(raw)}", key)
    v = float(v)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise bad_request(f"'{key}' must be {'>' if lo_open else '>='} {lo:g}, got {v:g}", key)
    if hi is not None and v > hi:
        raise bad_request(f"'{key}' must be <= {hi:g}, got {v:g}", key)
    return v


def _opt_str(d: dict, key: str, at: str, param: str) -> str | None:
    """`d[key]`, a string or None (absent); a 400 naming `at.key` otherwise."""
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"'{at}.{key}' must be a string, got {_type_name(v)} {_show(v)}", param)
    return v


# pydantic's lax mode (vLLM's) reads a boolean field from these strings, in any case and
# never with surrounding whitespace, and from the numbers 0 and 1 (0.0 and 1.0 too)
_BOOL_TEXT = {
    **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False),
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
}


def _bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in _BOOL_TEXT:
        return _BOOL_TEXT[v.lower()]
    if isinstance(v, (int, float)) and v in (0, 1):
        return v == 1
    raise bad_request(f"'{key}' must be a boolean, got {_type_name(v)} {_show(v)}", key)


def opt_bool(body: dict, key: str) -> bool | None:
    return None if body.get(key) is None else _bool(body, key, False)


# Limits on what one request may ask for: every stop string is looked for after every token
# (on the engine's thread, which serves everyone), every choice is a request.
MAX_STOP = 1024
MAX_N = 128
MAX_CHOICES = 1024  # prompts x n
MAX_REQUEST_ID_CHARS = 256


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise bad_request("'stop' must be a string or an array of strings", "stop")
    if len(v) > MAX_STOP:
        raise bad_request(f"'stop' may hold at most {MAX_STOP} strings, got {len(v)}", "stop")
    for s in v:
        if not s:  # it would match everywhere (vLLM refuses it too)
            raise bad_request("'stop' cannot contain an empty string", "stop")
        if len(s) > MAX_STOP_CHARS:
            raise bad_request(
                f"'stop' strings may be at most {MAX_STOP_CHARS} characters long, got one of {len(s)}", "stop"
            )
    return v


def _logit_bias(body: dict) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    out = {}
    if len(v) > 1024:
        raise bad_request(f"'logit_bias' may hold at most 1024 token ids, got {len(v)}", "logit_bias")
    for k, b in v.items():
        k2 = k.strip()
        if not (k2.isascii() and k2.isdigit() and len(k2) <= 18):
            raise bad_request(f"'logit_bias' keys must be non-negative token ids, got {_show(k)}", "logit_bias")
        t = int(k2)
        b = _lax_float(b)
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad_request(f"'logit_bias' values must be numbers in -100..100, got {_show(b)}", "logit_bias")
        out[t] = float(b)
    return out or None


# vLLM's fields that change the output (or, `priority`, the order requests are served in),
# and the value that asks for nothing (null always does): anything else is refused, as
# ignoring it would return unconstrained output (or serve the request as if it had none)
_NOT_HONOURED = (
    ("guided_choice", "guided decoding", []),
    ("guided_grammar", "guided decoding", ""),
    ("structural_tag", "guided decoding", ""),
    ("structured_outputs", "structured output", {}),
    ("use_beam_search", "beam search", False),
    ("min_p", "min-p sampling", 0.0),
    ("typical_p", "typical sampling", 1.0),
    ("allowed_token_ids", "a token allow-list", []),
    ("bad_words", "banned words", []),
    ("logits_processors", "custom logits processors", []),
    ("truncate_prompt_tokens", "prompt truncation", None),
    ("skip_special_tokens", "special tokens in the output", True),
    ("prompt_logprobs", "the prompt's logprobs apart from echo", None),
    ("return_tokens_as_token_ids", "token ids as logprobs' tokens", False),
    ("return_token_ids", "token ids in the response", False),
    ("prompt_embeds", "prompts as embeddings", None),
    # vLLM refuses a priority other than 0 unless served with --scheduling-policy priority
    ("priority", "priority scheduling", 0),
)


def _refuse_unsupported(body: dict, kind: str) -> None:
    """400 for fields that would change the output in a way this server cannot honour."""
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", None):
            raise bad_request(
                "'response_format' (JSON mode / structured output) is not supported by this server; "
                'only {"type": "text"}',
                "response_format",
            )
    # chat's tools and tool_choice: `_tools`
    for key in ("functions",) if kind == "chat" else ("tools", "functions"):
        if body.get(key):
            raise bad_request(f"'{key}' (tool / function calling) is not supported by this server", key)
    for key in ("function_call",) if kind == "chat" else ("tool_choice", "function_call"):
        v = body.get(key)
        if v is not None and v != "none":
            raise bad_request(f"'{key}' (tool / function calling) is not supported by this server", key)
    if body.get("guided_json") is not None or body.get("guided_regex") is not None:
        raise bad_request("guided decoding is not supported by this server", "guided_json")
    for key, what, neutral in _NOT_HONOURED:
        v = body.get(key)
        if v is None or (v == neutral and type(v) is type(neutral)):
            continue
        if isinstance(neutral, (list, dict)) and isinstance(v, (list, dict)) and not v:
            continue  # an empty list or object asks for nothing
        if type(neutral) in (int, float) and not isinstance(v, bool) and _lax_float(v) == neutral:
            continue  # 0.0 for 0, "0" (as vLLM reads it)
        if neutral is None:
            allowed = "only null"
        elif isinstance(neutral, (list, dict)):
            allowed = "only empty or null"
        else:
            allowed = f"only {json.dumps(neutral)} or null"
        raise bad_request(f"'{key}' ({what}) is not supported by this server; {allowed}", key)
    if kind == "chat" and body.get("documents"):
        # vLLM passes them to the chat template, which this server does not
        raise bad_request(
            "'documents' (RAG documents for the chat template) is not supported by this server", "documents"
        )
    if kind == "completion":
        suffix = body.get("suffix")
        if suffix is not None and suffix != "":
            raise bad_request("'suffix' (insertion) is not supported by this server", "suffix")


def int_list(body: dict, key: str) -> list[int]:
    """A list of token ids (numbers written as strings taken, see _INT_TEXT, and whole
    floats, as _int takes them); missing: []."""
    v = body.get(key)
    if v is None:
        return []
    if isinstance(v, list):
        v = [_lax_int(x, key) for x in v]
        # (orjson reads an integer beyond 64 bits in a list as a float: that one stays refused)
        v = [int(x) if isinstance(x, float) and x.is_integer() and abs(x) < _BEYOND_INT64 else x for x in v]
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if v and min(v) < 0:  # checked here, not in SamplingParams, so that the 400 names the field
            raise bad_request(f"'{key}' must be non-negative token ids, got {_show(min(v))}", key)
        return v
    raise bad_request(f"'{key}' must be an array of integers", key)


@dataclass
class ParsedRequest:
    """A validated completion or chat request."""

    kind: str  # "completion" or "chat"
    model: str
    prompt_text: str | None  # the (first) prompt as text (None if token ids were given)
    prompt_ids: list[int] | None  # token ids given by the client (first prompt)
    messages: list[dict] | None
    max_tokens: int | None  # None: the server's default
    max_tokens_param: str  # the field that gave max_tokens (chat: max_completion_tokens or max_tokens)
    params: SamplingParams | None  # filled once max_tokens is known
    stream: bool
    include_usage: bool
    continuous_usage: bool
    raw: dict
    prompts: list | None = None  # completions: every prompt, a str or a list of token ids
    n: int = 1
    echo: bool = False
    # completions' `max_tokens: null`: vLLM's "not set" (the room left, or the model's
    # max_new_tokens), where a missing field is OpenAI's default of 16
    max_tokens_null: bool = False
    logprobs: int | None = None  # top logprobs per token (None: no logprobs)
    # completions' `max_tokens: 0` (with `echo`): the prompt (and its logprobs) only; the
    # engine still samples the one token that ends the prefill, and it is not returned
    score_only: bool = False
    # chat: how the messages are rendered (vLLM's fields; see `chat_options`)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    tools: list | None = None  # chat: the tools the chat template sees
    # chat's `echo` (vLLM's): the text returned before each choice's output
    chat_echo: str = ""
    # vLLM's `add_special_tokens` (BOS) for text prompts; None: the route's default
    add_special_tokens: bool | None = None
    # vLLM's `request_id`: the response's id is `cmpl-`/`chatcmpl-` + it (an X-Request-Id
    # header wins over it); None: a fresh id
    request_id: str | None = None

    @property
    def chat_options(self) -> dict:
        """The keywords of a tokenizer's `render_chat(messages, **options)`."""
        return {
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "template_kwargs": self.chat_template_kwargs,
            "tools": self.tools,
        }

    @property
    def all_prompts(self) -> list:
        if self.prompts is not None:
            return self.prompts
        return [self.prompt_ids if self.prompt_ids is not None else self.prompt_text]


def parse_body(data: bytes) -> dict:
    if not data:
        raise bad_request("the request body is empty; a JSON object is expected")
    try:
        body = loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad_request("the request body is not valid JSON (UTF-8)", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}")
    if _orjson is not None and any(type(v) is float and abs(v) >= _BEYOND_INT64 for v in body.values()):
        # orjson reads an integer beyond 64 bits as a float: read the body again for the
        # integer the client wrote, so that an error message shows it
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):  # e.g. more digits than Python converts
            pass
    return body


_BEYOND_INT64 = float(2**63)


def _common(body: dict, kind: str) -> dict:
    model = body.get("model")
    if model is None:
        raise bad_request("you must provide a model parameter", "model")
    if not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {_type_name(model)}", "model")
    _refuse_unsupported(body, kind)
    n = _int(body, "n", 1, 1)
    if n > MAX_N:
        raise bad_request(f"'n' must be at most {MAX_N}, got {n}", "n")
    echo = False
    if kind == "completion":
        best_of = _int(body, "best_of", None, 1)
        if best_of is not None and best_of != n:
            raise bad_request("'best_of' is only supported equal to n (every choice is returned)", "best_of")
        echo = _bool(body, "echo", False)
        lp = body.get("logprobs")
        if lp is None or lp is False:
            logprobs = None
        else:
            logprobs = _int(body, "logprobs", None, 0)
    else:
        logprobs = 0 if _bool(body, "logprobs", False) else None
        top = _int(body, "top_logprobs", None, 0)
        if top is not None:
            if logprobs is None and top > 0:
                raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            if logprobs is not None:
                logprobs = top
    if logprobs is not None and logprobs > MAX_LOGPROBS:
        param = "logprobs" if kind == "completion" else "top_logprobs"
        raise bad_request(f"'{param}' must be at most {MAX_LOGPROBS}, got {logprobs}", param)
    stream = _bool(body, "stream", False)
    so = body.get("stream_options")
    include_usage = continuous = False
    if so is not None:
        if not isinstance(so, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        # as OpenAI and current vLLM: include_usage defaults to false (older vLLM releases
        # defaulted it to true), and per-chunk usage needs it (continuous_usage_stats alone
        # adds nothing: vLLM's include_continuous_usage = include_usage and continuous)
        include_usage = _bool(so, "include_usage", False)
        continuous = _bool(so, "continuous_usage_stats", False) and include_usage
    # None (not given): the model's default (generation_config.json), else SamplingParams'
    temperature = _float(body, "temperature", None, 0.0, 2.0)
    top_p = _float(body, "top_p", None, 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", None)
    if top_k is not None and top_k < -1:
        raise bad_request(f"'top_k' must be 0 or -1 (off) or a positive integer, got {top_k}", "top_k")
    presence = _float(body, "presence_penalty", 0.0, -2.0, 2.0)
    frequency = _float(body, "frequency_penalty", 0.0, -2.0, 2.0)
    repetition = _float(body, "repetition_penalty", None, 0.0, lo_open=True)
    seed = _int(body, "seed", None)
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        raise bad_request(f"'seed' must be a 64-bit signed integer ({INT64_MIN}..{INT64_MAX}), got {seed}", "seed")
    min_tokens = _int(body, "min_tokens", 0, 0)
    request_id = body.get("request_id")
    if request_id is not None and not (isinstance(request_id, str) and len(request_id) <= MAX_REQUEST_ID_CHARS):
        # (echoed in every streamed event: bounded)
        raise bad_request(
            f"'request_id' must be a string of at most {MAX_REQUEST_ID_CHARS} characters, got "
            f"{_type_name(request_id)} {_show(request_id)}",
            "request_id",
        )
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
        raise bad_request(
            f"'cache_salt' must be a non-empty string, got {_type_name(cache_salt)} {_show(cache_salt)}", "cache_salt"
        )
    return dict(
        model=model,
        stream=stream,
        include_usage=include_usage,
        continuous=continuous,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        min_tokens=min_tokens,
        stop=_stop(body),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False),
        stop_token_ids=int_list(body, "stop_token_ids"),
        ignore_eos=_bool(body, "ignore_eos", False),
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        logit_bias=_logit_bias(body),
        n=n,
        echo=echo,
        logprobs=logprobs,
        cache_salt=cache_salt,
        request_id=request_id,
    )


def _max_tokens(body: dict, *keys: str, minimum: int = 1) -> tuple[int | None, str]:
    """(the value, the field it came from) of the first of `keys` given; (None, keys[0])."""
    for key in keys:
        if body.get(key) is not None:
            return _int(body, key, None, minimum), key
    return None, keys[0]


def _too_many_ids(n: int, limit: int) -> APIError:
    return bad_request(
        f"the prompt has {n} token ids, more than the model's context ({limit} tokens)",
        "prompt",
        "context_length_exceeded",
    )


def _is_ids(x) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_completion(body: dict, max_prompt_ids: int | None = None) -> ParsedRequest:
    """A completion request; a token-id prompt longer than `max_prompt_ids` is refused
    before its ids are looked at. `prompt` is a string, an array of token ids, or an array
    of several of those (one choice per prompt, as OpenAI and vLLM take it)."""
    c = _common(body, "completion")
    if "prompt" not in body:
        raise bad_request("you must provide a prompt parameter", "prompt")
    p = body["prompt"]
    if isinstance(p, str):
        prompts = [p]
    elif isinstance(p, list):
        if not p:
            raise bad_request("'prompt' must not be empty", "prompt")
        if isinstance(p[0], int) and not isinstance(p[0], bool):
            prompts = [p]  # one prompt of token ids
        else:
            prompts = p
        if len(prompts) * c["n"] > MAX_CHOICES:
            raise bad_request(
                f"{len(prompts)} prompts x n={c['n']} are more than the {MAX_CHOICES} choices one request may ask for",
                "prompt",
            )
        for q in prompts:
            if isinstance(q, str):
                continue
            if not isinstance(q, list):
                raise bad_request(
                    "'prompt' must be a string, an array of token ids, or an array of strings or of token-id arrays",
                    "prompt",
                )
            if max_prompt_ids is not None and len(q) > max_prompt_ids and q and isinstance(q[0], int):
                raise _too_many_ids(len(q), max_prompt_ids)
            if not _is_ids(q):
                raise bad_request(
                    "'prompt' must be a string, an array of token ids, or an array of strings or of token-id arrays",
                    "prompt",
                )
            if not q or min(q) < 0:
                raise bad_request("'prompt' token ids must be non-negative integers, at least one", "prompt")
    else:
        raise bad_request(f"'prompt' must be a string or an array of token ids, got {_type_name(p)}", "prompt")
    first = prompts[0]
    text = first if isinstance(first, str) else None
    ids = first if not isinstance(first, str) else None
    max_tokens, key = _max_tokens(body, "max_tokens", minimum=0)
    if max_tokens == 0 and not c["echo"]:
        raise bad_request(
            "'max_tokens' 0 is only allowed with 'echo': true (it returns the prompt, and its "
            "logprobs with 'logprobs', and generates nothing)",
            "max_tokens",
        )
    req = _finish(c, "completion", text, ids, None, (max_tokens, key), body)
    req.prompts = prompts
    req.max_tokens_null = "max_tokens" in body and body["max_tokens"] is None
    req.add_special_tokens = opt_bool(body, "add_special_tokens")
    if max_tokens == 0:
        req.score_only = True
    return req


MESSAGE_ROLES = ("system", "user", "assistant", "tool", "developer", "function")


def parse_chat(body: dict, max_messages: int | None = None, *, tokenize_only: bool = False) -> ParsedRequest:
    """A chat request; more than `max_messages` messages are refused before they are
    looked at. `tokenize_only` (/tokenize): `tool_choice` is not looked at, as nothing is
    generated."""
    c = _common(body, "chat")
    msgs = body.get("messages")
    if msgs is None:
        raise bad_request("you must provide a messages parameter", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty array", "messages")
    if max_messages is not None and len(msgs) > max_messages:
        raise bad_request(
            f"{len(msgs)} messages are more than the model's context can hold", "messages", "context_length_exceeded"
        )
    clean = [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
    req = _finish(c, "chat", None, None, clean, _max_tokens(body, "max_completion_tokens", "max_tokens"), body)
    req.add_generation_prompt, req.continue_final_message, req.chat_template_kwargs = _chat_rendering(body)
    req.tools = _tools(body, tokenize_only)
    req.add_special_tokens = opt_bool(body, "add_special_tokens")
    if _bool(body, "echo", False):
        # as vLLM: the last message is echoed when the reply continues its role, the
        # assistant's (or any role's without a generation prompt)
        last = clean[-1]
        if not req.add_generation_prompt or last["role"] == "assistant":
            req.chat_echo = content_text(last["content"])
    if req.tools is not None and req.chat_template_kwargs and "tools" in req.chat_template_kwargs:
        raise bad_request(
            "'chat_template_kwargs' cannot set 'tools' when the request gives 'tools'", "chat_template_kwargs"
        )
    return req


def _message(m, where: str) -> dict:
    """A chat message as vLLM passes it on to the chat template: `role`, `content` (a string,
    or its text parts, null as no parts: `chat_template.ChatTemplate` joins them or not), and
    where given `name`, an assistant's
    `tool_calls` and reasoning (as both `reasoning` and `reasoning_content`), a tool
    message's `tool_call_id`. Other fields, and those on other roles, are dropped."""
    if not isinstance(m, dict):
        raise bad_request(f"'{where}' must be an object", where)
    role = m.get("role")
    if role not in MESSAGE_ROLES:
        raise bad_request(
            f"'{where}.role' must be one of system, user, assistant, tool, developer; got {_show(role)}",
            f"{where}.role",
        )
    content = m.get("content")
    if content is None:
        content = []
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"'{where}.content[{j}]' must be a text part "
                    '({"type": "text", "text": ...}); other parts are not '
                    "supported",
                    f"{where}.content",
                )
        content = [{"type": "text", "text": part["text"]} for part in content]
    elif not isinstance(content, str):
        raise bad_request(f"'{where}.content' must be a string or an array of text parts", f"{where}.content")
    out = {"role": role, "content": content}
    name = _opt_str(m, "name", where, f"{where}.name")
    if name is not None:
        out["name"] = name
    calls = m.get("tool_calls")
    if calls is not None and role == "assistant":
        calls = _tool_calls(calls, f"{where}.tool_calls")
        if calls:  # an empty list: the template's plain assistant turn (as vLLM)
            out["tool_calls"] = calls
    if role == "assistant":
        key = "reasoning" if "reasoning" in m else "reasoning_content"
        reasoning = _opt_str(m, key, where, f"{where}.{key}")
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    call_id = _opt_str(m, "tool_call_id", where, f"{where}.tool_call_id") if role == "tool" else None
    if call_id is not None:
        out["tool_call_id"] = call_id
    return out


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's tool calls: `id` and `type` where given, `function` with its
    `name` and `arguments`, a JSON text parsed into its value (as vLLM and transformers'
    templates expect; a text that is not JSON, or none, is {} as in vLLM)."""
    if not isinstance(calls, list):
        raise bad_request(f"'{where}' must be an array of tool calls, got {_type_name(calls)}", where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        shape = '{"type": "function", "function": {"name": ..., "arguments": ...}}'
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise bad_request(f"'{at}' must be a tool call {shape}", where)
        clean = {}
        for key in ("id", "type"):
            v = _opt_str(call, key, at, where)
            if v is not None:
                clean[key] = v
        if clean.get("type", "function") != "function":
            raise bad_request(f"'{at}.type' must be 'function', got {_show(clean['type'])}", where)
        fn = call["function"]
        name = fn.get("name")
        if not isinstance(name, str):
            raise bad_request(f"'{at}.function.name' must be a string, got {_type_name(name)} {_show(name)}", where)
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            raise bad_request(
                f"'{at}.function.arguments' must be a JSON text (or an object), got {_type_name(args)} {_show(args)}",
                where,
            )
        clean["function"] = {"name": name, "arguments": _arguments(args)}
        out.append(clean)
    return out


def _arguments(args) -> dict:
    """A tool call's arguments as an object: a JSON text that is not one (or not JSON) is
    {}, as vLLM gives templates that iterate over them."""
    if isinstance(args, dict):
        return args
    if not args:
        return {}
    try:
        value = json.loads(args)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _tools(body: dict, tokenize_only: bool) -> list | None:
    """The request's `tools` (checked, passed to the chat template as given), or None. The
    server parses no tool calls out of the output: with tools, `tool_choice` must be
    `"none"` (the model's reply is text), as vLLM without a tool-call parser requires."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is not None:
        shape = '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}'
        if not isinstance(tools, list) or not tools:
            raise bad_request(f"'tools' must be a non-empty array of tools {shape}", "tools")
        for i, tool in enumerate(tools):
            at = f"tools[{i}]"
            if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
                raise bad_request(f"'{at}' must be a tool {shape}", "tools")
            if tool.get("type", "function") != "function":
                raise bad_request(f"'{at}.type' must be 'function', got {_show(tool.get('type'))}", "tools")
            fn = tool["function"]
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise bad_request(f"'{at}.function.name' must be a non-empty string, got {_show(name)}", "tools")
            for key, kind, ok in (("description", "a string", str), ("parameters", "an object", dict)):
                v = fn.get(key)
                if v is not None and not isinstance(v, ok):
                    raise bad_request(f"'{at}.function.{key}' must be {kind}, got {_type_name(v)} {_show(v)}", "tools")
    # an explicit null tool_choice is "none" (vLLM defaults to "auto" only when it is absent)
    if tokenize_only or choice == "none" or (choice is None and (tools is None or "tool_choice" in body)):
        return tools
    if choice is None or choice == "auto":
        raise bad_request(
            "tool_choice 'auto' (the default with 'tools') needs a tool-call parser, which this server does not "
            'have: send "tool_choice": "none" to have the chat template see the tools and get the model\'s reply '
            "as text",
            "tool_choice",
        )
    raise bad_request(
        f"'tool_choice' {_show(choice)} is not supported by this server (it cannot force tool calls); only \"none\"",
        "tool_choice",
    )


# variables a chat template gets from the server, not from chat_template_kwargs
_RESERVED_TEMPLATE_KWARGS = ("messages",)


def _chat_rendering(body: dict) -> tuple[bool, bool, dict | None]:
    """(add_generation_prompt, continue_final_message, chat_template_kwargs) of a chat
    request, as vLLM takes them: `chat_template_kwargs` (an object) is passed to the chat
    template, and its `add_generation_prompt` / `continue_final_message` replace the
    fields'; both true is a 400, as is a request's own `chat_template`."""
    if body.get("chat_template") is not None:
        raise bad_request(
            "'chat_template' in a request is not supported: the server applies the model's "
            "template (or its --chat-template)",
            "chat_template",
        )
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_request(
            f"'chat_template_kwargs' must be an object, got {_type_name(kwargs)} {_show(kwargs)}",
            "chat_template_kwargs",
        )
    kwargs = dict(kwargs) if kwargs else None
    fields = {}
    for key, default in (("add_generation_prompt", True), ("continue_final_message", False)):
        fields[key] = _bool(body, key, default)
        if kwargs is not None and key in kwargs:
            v = kwargs.pop(key)
            if not isinstance(v, bool):
                raise bad_request(
                    f"'chat_template_kwargs.{key}' must be a boolean, got {_type_name(v)} {_show(v)}",
                    "chat_template_kwargs",
                )
            fields[key] = v
    for key in _RESERVED_TEMPLATE_KWARGS:
        if kwargs is not None and key in kwargs:
            raise bad_request(
                f"'chat_template_kwargs' cannot set '{key}' (the template gets the request's own)",
                "chat_template_kwargs",
            )
    if fields["add_generation_prompt"] and fields["continue_final_message"]:
        raise bad_request(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true: continue the last "
            "message, or start a new assistant message (set 'add_generation_prompt': false)",
            "continue_final_message",
        )
    return fields["add_generation_prompt"], fields["continue_final_message"], kwargs or None


def _finish(c: dict, kind: str, text, ids, messages, max_tokens: tuple, body) -> ParsedRequest:
    return ParsedRequest(
        kind=kind,
        model=c["model"],
        prompt_text=text,
        prompt_ids=ids,
        messages=messages,
        max_tokens=max_tokens[0],
        max_tokens_param=max_tokens[1],
        params=None,
        stream=c["stream"],
        include_usage=c["include_usage"],
        continuous_usage=c["continuous"],
        raw=c,
        n=c["n"],
        echo=c["echo"],
        logprobs=c["logprobs"],
        request_id=c["request_id"],
    )


# the request fields a model's generation_config.json gives defaults for (besides max_tokens)
DEFAULTED = ("temperature", "top_p", "top_k", "repetition_penalty")


def sampling_params(
    req: ParsedRequest, max_tokens: int, defaults: dict | None = None, cap: int | None = None
) -> SamplingParams:
    """The engine's parameters of a request: its own fields, else the model's `defaults`
    (generation_config.json), else SamplingParams' (as vLLM's to_sampling_params).
    `cap`: the server's max_tokens cap (Backend.max_tokens_cap), to name what cut it."""
    c = req.raw
    chosen = {k: v for k, v in (defaults or {}).items() if k in DEFAULTED}
    chosen.update((k, c[k]) for k in DEFAULTED if c[k] is not None)
    if c["min_tokens"] > max_tokens:
        if req.max_tokens is None:
            what = f"the default max_tokens ({max_tokens})"
        elif req.max_tokens > max_tokens:
            why = "the server's max_new_tokens cap" if max_tokens == cap else "the room the prompt leaves"
            what = f"max_tokens ({max_tokens}: the {req.max_tokens} asked for, cut to {why})"
        else:
            what = f"max_tokens ({max_tokens})"
        raise bad_request(f"'min_tokens' ({c['min_tokens']}) must be at most {what}", "min_tokens")
    return SamplingParams(
        max_tokens=max(1, max_tokens),  # 0 (score_only): the prefill's token is dropped
        **chosen,
        seed=c["seed"],
        stop=c["stop"],
        include_stop_str_in_output=c["include_stop_str_in_output"],
        stop_token_ids=c["stop_token_ids"],
        ignore_eos=c["ignore_eos"],
        min_tokens=c["min_tokens"],
        presence_penalty=c["presence_penalty"],
        frequency_penalty=c["frequency_penalty"],
        logit_bias=c["logit_bias"],
        logprobs=c["logprobs"],
        prompt_logprobs=c["logprobs"] if req.echo else None,
        cache_salt=c["cache_salt"],
    )


# ---- SSE framing --------------------------------------------------------------------
class ChunkWriter:
    """Builds the `data: {json}\\n\\n` events of one streamed response.

    The constant part of every chunk (id, object, created, model, the choice's index) is
    serialized once; each token then costs one string escape and a concatenation."""

    __slots__ = ("_heads", "_prefix", "chat", "usage_null", "_id", "_created", "_model", "_object")

    def __init__(self, rid: str, created: int, model: str, chat: bool, include_usage: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._id, self._created, self._model, self._object = rid, created, model, obj
        self._prefix = (
            f'data: {{"id":{dumps(rid)},"object":"{obj}","created":{created},'
            f'"model":{dumps(model)},"choices":[{{"index":'
        )
        self._heads: dict[int, str] = {}
        self.chat = chat
        self.usage_null = ',"usage":null' if include_usage else ""

    def head(self, index: int = 0) -> str:
        h = self._heads.get(index)
        if h is None:
            h = self._heads[index] = f"{self._prefix}{index},"
        return h

    def role(self, index: int = 0, usage: dict | None = None) -> str:
        """The chat stream's first event of a choice; `usage` with continuous usage stats
        (the prompt's tokens, none generated yet: vLLM's role chunk)."""
        u = self.usage_null if usage is None else ',"usage":' + dumps(usage)
        return (
            self.head(index) + '"delta":{"role":"assistant","content":""},"logprobs":null,'
            '"finish_reason":null}]' + u + "}\n\n"
        )

    def token(
        self,
        text: str,
        finish_reason: str | None = None,
        usage: dict | None = None,
        stop_reason: int | str | None = None,
        index: int = 0,
        logprobs: dict | None = None,
    ) -> str:
        fr = "null" if finish_reason is None else f'"{finish_reason}"'
        u = self.usage_null if usage is None else ',"usage":' + dumps(usage)
        sr = "null" if stop_reason is None else dumps(stop_reason)
        lp = "null" if logprobs is None else dumps(logprobs)
        if self.chat:
            return (
                self.head(index) + '"delta":{"content":' + dumps(text) + '},"logprobs":' + lp + ","
                '"finish_reason":' + fr + ',"stop_reason":' + sr + "}]" + u + "}\n\n"
            )
        return (
            self.head(index)
            + '"text":'
            + dumps(text)
            + ',"logprobs":'
            + lp
            + ',"finish_reason":'
            + fr
            + ',"stop_reason":'
            + sr
            + "}]"
            + u
            + "}\n\n"
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        return (
            "data: "
            + dumps(
                {
                    "id": self._id,
                    "object": self._object,
                    "created": self._created,
                    "model": self._model,
                    "choices": [],
                    "usage": usage_dict(prompt_tokens, completion_tokens),
                }
            )
            + "\n\n"
        )

    @staticmethod
    def error(err: APIError) -> str:
        return "data: " + dumps(err.body()) + "\n\n"

    DONE = "data: [DONE]\n\n"


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# ---- logprobs -----------------------------------------------------------------------
def completion_logprobs(entries: list, token_text, offset: int = 0) -> dict:
    """The completions API's `logprobs` object for `entries` (per token: (token id, its
    logprob, [(id, logprob)] top), or (token id, None, None) for a prompt's first token);
    `token_text(id)` is a token's text; `offset`: the text offset of the first token.
    A token's `top_logprobs` holds the token itself, then its alternatives (OpenAI's "up
    to logprobs + 1" and vLLM's: `logprobs: 0` gives the token alone)."""
    tokens, lps, tops, offs = [], [], [], []
    for tok, lp, top in entries:
        t = token_text(tok)
        tokens.append(t)
        lps.append(lp)
        if top is None:  # a prompt's first token: no logprob, no alternatives
            tops.append(None)
        else:
            d = {t: lp}
            for i, v in top:
                d.setdefault(token_text(i), v)
            tops.append(d)
        offs.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


def join_logprobs(a: dict, b: dict) -> dict:
    """Two completions `logprobs` objects one after the other (echo: prompt, then output)."""
    return {k: a[k] + b[k] for k in a}


def logprobs_object(entries: list, token_text, chat: bool, offset: int = 0, prompt: list | None = None) -> dict:
    """A choice's `logprobs`: the chat API's, or the completions API's with `offset` the text
    offset of the first entry and, for echo, the `prompt`'s entries (offset 0) first."""
    if chat:
        return chat_logprobs(entries, token_text)
    lp = completion_logprobs(entries, token_text, offset)
    if prompt is not None:
        lp = join_logprobs(completion_logprobs(prompt, token_text), lp)
    return lp


def prompt_entries(ids: list[int], plps: list) -> list:
    """`completion_logprobs` entries of a prompt: its ids and `RequestOutput.prompt_logprobs`."""
    return [(t, None, None) if e is None else (t, e[0], e[1]) for t, e in zip(ids, plps)]


def chat_logprobs(entries: list, token_text) -> dict:
    """The chat API's `logprobs` object: `{"content": [{token, logprob, bytes, top_logprobs}]}`."""

    def item(i, v):
        t = token_text(i)
        return {"token": t, "logprob": v, "bytes": list(t.encode("utf-8", "surrogatepass"))}

    content = []
    for tok, lp, top in entries:
        d = item(tok, lp)
        d["top_logprobs"] = [item(i, v) for i, v in top]
        content.append(d)
    return {"content": content}


def completion_choice(
    index: int, text: str, finish_reason: str, stop_reason=None, logprobs: dict | None = None
) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def chat_choice(index: int, text: str, finish_reason: str, stop_reason=None, logprobs: dict | None = None) -> dict:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def response_body(
    chat: bool, rid: str, created: int, model: str, choices: list, prompt_tokens: int, completion_tokens: int
) -> dict:
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_dict(prompt_tokens, completion_tokens),
    }
