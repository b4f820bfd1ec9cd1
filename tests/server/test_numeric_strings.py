"""Numbers written as strings in a request body, as vLLM takes them (pydantic's lax mode):
`"temperature": "0.5"` and `"max_tokens": "16"` were a 400 here. A string that is no
number, an integer field's "16.5" or "1e3" (pydantic refuses both) stay 400s naming the
field. Booleans too: "true"/"no"/"1"/... and the numbers 0 and 1 are read as pydantic reads
them; other values (" true", "2", 2, 0.5) stay 400s."""

from __future__ import annotations

import pytest

from llmsched.server.protocol import APIError, parse_chat, parse_completion, sampling_params

BASE = {"model": "m", "prompt": "x"}


def _params(**fields):
    req = parse_completion({**BASE, **fields})
    return req, sampling_params(req, req.max_tokens or 16)


def test_numeric_strings_are_numbers():
    req, p = _params(
        temperature="0.5",
        top_p=" 0.9 ",
        top_k="20",
        max_tokens="16.0",
        n="2",
        seed="-7",
        min_tokens="1_0",
        presence_penalty="1e-1",
        repetition_penalty="+1.1",
        stop_token_ids=["5", 6, 7.0],
        logit_bias={"5": "-1.5"},
        priority="0",
        min_p="0",
    )
    assert (req.max_tokens, req.n) == (16, 2)
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.min_tokens) == (0.5, 0.9, 20, -7, 10)
    assert (p.presence_penalty, p.repetition_penalty, p.stop_token_ids) == (0.1, 1.1, [5, 6, 7])
    assert p.logit_bias == {5: -1.5}
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "9"})
    assert chat.max_tokens == 9
    assert parse_completion({**BASE, "logprobs": "2", "echo": True}).logprobs == 2


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("temperature", "hot", "'temperature' must be a number, got string 'hot'"),
        ("temperature", "nan", "'temperature' must be a number, got string 'nan'"),
        ("temperature", "3", "'temperature' must be <= 2, got 3"),
        ("max_tokens", "16.5", "'max_tokens' must be an integer, got string '16.5'"),
        ("max_tokens", "1e3", "'max_tokens' must be an integer, got string '1e3'"),
        ("max_tokens", "0", "'max_tokens' 0 is only allowed with 'echo': true"),
        ("max_tokens", "9" * 5000, "'max_tokens' must be a 64-bit integer"),
        ("seed", "99999999999999999999", "'seed' must be a 64-bit integer"),
        ("stop_token_ids", ["5", "x"], "'stop_token_ids' must be an array of integers"),
        ("logit_bias", {"5": "lots"}, "'logit_bias' values must be numbers in -100..100"),
        ("priority", "1", "'priority' (priority scheduling) is not supported"),
        ("stream", " true", "'stream' must be a boolean, got string ' true'"),
        ("stream", "2", "'stream' must be a boolean, got string '2'"),
        ("echo", 2, "'echo' must be a boolean, got integer 2"),
        ("ignore_eos", 0.5, "'ignore_eos' must be a boolean, got number 0.5"),
        ("add_special_tokens", "", "'add_special_tokens' must be a boolean, got string ''"),
    ],
)
def test_other_strings_stay_400s(field, value, says):
    with pytest.raises(APIError) as e:
        _params(**{field: value})
    assert e.value.status == 400 and e.value.param == field and says in e.value.message


@pytest.mark.parametrize(
    "text, value",
    [(t, True) for t in ("true", "TRUE", "yes", "On", "1", "t", "Y", 1, 1.0)]
    + [(t, False) for t in ("false", "No", "OFF", "0", "f", "n", 0, 0.0)],
)
def test_boolean_strings_are_booleans(text, value):
    """pydantic's lax bool (vLLM's request models): these strings in any case, 0 and 1."""
    req, p = _params(stream=text, echo=text, ignore_eos=text, include_stop_str_in_output=text, add_special_tokens=text)
    assert (req.stream, req.echo, req.add_special_tokens) == (value, value, value)
    assert (p.ignore_eos, p.include_stop_str_in_output) == (value, value)
    req = parse_completion({**BASE, "stream": True, "stream_options": {"include_usage": text}})
    assert req.include_usage is value
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}]
    chat = parse_chat({"model": "m", "messages": msgs, "logprobs": text, "add_generation_prompt": text, "echo": text})
    assert (chat.logprobs == 0, chat.add_generation_prompt, chat.chat_echo == "a") == (value, value, value)
