"""What a request has emitted, and when it stops: the one stop checker of every driver.

A token ends a request when (as in vLLM and the OpenAI API):
- it is an end-of-sequence id (unless `ignore_eos`) or one of `stop_token_ids`: finish
  reason "stop"; the token's text is not returned (`stop_reason` is the id, None for EOS);
- its text completes one of the `stop` strings: "stop", the text is cut before the string
  (`stop_reason` is the string);
- with `include_stop_str_in_output` (vLLM's extension), the stop string, or the stop
  token's text, is kept: the text is cut after it;
- it is the last of `max_tokens`: "length".
No stop condition applies to the first `min_tokens` tokens (a stop id or an EOS id, even with
`ignore_eos`, cannot even be drawn among them, and, as in vLLM, stop strings are looked
for only once more than `min_tokens` tokens exist, so a stop string must end after the text of the first `min_tokens`).
While streaming, the last `len(longest stop) - 1` characters are held back until they
cannot start a stop string (not with `include_stop_str_in_output`: the text is then never
cut before what was sent).
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.engine_api import RequestOutput, SamplingParams, find_stop
from ..core.request import Request

# piece(final, drop_token): the text the newest token adds; `final`: flush held-back bytes;
# `drop_token`: without the newest token (it stopped the request and is not returned)
PieceFn = Callable[[bool, bool], str]


class Sequence:
    """Driver-side data of one request (the `payload` of its `Request`): the sampling
    parameters, the text so far and the stop state."""

    __slots__ = (
        "request_id",
        "params",
        "req",
        "prompt_len",
        "n_out",
        "text",
        "sent",
        "hold",
        "stops",
        "stop_ids",
        "eos_ids",
        "min_banned",
        "finish_reason",
        "stop_reason",
        "logprob",
        "prompt_lps",
    )

    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        params: SamplingParams,
        eos_ids: frozenset = frozenset(),
        config_stop_ids: frozenset = frozenset(),
    ):
        self.request_id = request_id
        self.params = params
        self.req: Request | None = None
        self.prompt_len = prompt_len
        self.n_out = 0
        self.text = ""
        self.sent = 0  # characters of `text` already returned
        self.stops = [s for s in params.stop if s]
        self.hold = 0 if params.include_stop_str_in_output else max((len(s) for s in self.stops), default=1) - 1
        # config_stop_ids: a generation config's other EOS ids, stop ids unless ignore_eos (as vLLM)
        self.stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else config_stop_ids)
        self.eos_ids = frozenset() if params.ignore_eos else eos_ids
        # as vLLM (its _all_stop_token_ids): no EOS id is drawn among the first min_tokens
        # even with ignore_eos, which only stops them from ending the request
        self.min_banned = frozenset(params.stop_token_ids) | config_stop_ids | eos_ids
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprob = None  # the next token's logprobs, set by an executor (SamplingParams.logprobs)
        # SamplingParams.prompt_logprobs: per prompt token so far, None (the first) or
        # (logprob, top), filled by an executor during prefill; returned with the first token
        self.prompt_lps: list | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def banned_ids(self) -> frozenset | None:
        """Token ids the sampler must not draw now (min_tokens), or None."""
        if self.n_out >= self.params.min_tokens:
            return None
        return self.min_banned or None

    def accept(self, tok: int, length_done: bool, piece: PieceFn | None) -> RequestOutput:
        """Record one emitted token; returns what to stream (and whether it ended the request).
        `length_done`: the request has all `max_tokens`; `piece`: None without a tokenizer."""
        self.n_out += 1
        min_tokens = self.params.min_tokens
        reason = None
        by_token = False
        if self.n_out > min_tokens and tok in self.eos_ids:
            reason, by_token = "stop", True
        elif self.n_out > min_tokens and tok in self.stop_ids:
            reason, by_token, self.stop_reason = "stop", True, tok
        elif length_done:
            reason = "length"
        if piece is not None:
            if not by_token:
                new = piece(reason is not None, False)
                if new:
                    self.text += new
                    # as vLLM: stop strings once more than min_tokens tokens exist; one
                    # token per call, so a stop string must end in this token's text (not
                    # wholly in the first min_tokens tokens')
                    if self.stops and self.n_out > min_tokens:
                        found = find_stop(self.text, len(new), self.stops)
                        if found is not None:
                            cut, self.stop_reason = found
                            if self.params.include_stop_str_in_output:
                                cut += len(self.stop_reason)
                            self.text = self.text[:cut]
                            self.sent = min(self.sent, cut)
                            reason = "stop"
            elif reason is not None:
                self.text += piece(True, not self.params.include_stop_str_in_output)
        if reason is not None:
            self.finish_reason = reason
            upto = len(self.text)
        else:
            upto = max(self.sent, len(self.text) - self.hold)
        new_text = self.text[self.sent : upto]
        self.sent = upto
        lp = self.logprob
        if lp is not None:
            self.logprob = None
        plp = self.prompt_lps if self.n_out == 1 else None
        return RequestOutput(
            request_id=self.request_id,
            new_token_ids=[tok],
            new_text=new_text,
            finished=reason is not None,
            finish_reason=reason,
            prompt_tokens=self.prompt_len,
            output_tokens=self.n_out,
            stop_reason=self.stop_reason if reason == "stop" else None,
            logprobs=None if lp is None else [lp],
            prompt_logprobs=plp,
        )


__all__ = ["Sequence", "PieceFn"]
