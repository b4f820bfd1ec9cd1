"""`LLMEngine`: a real `EngineCore` whose steps are the plans of a llmsched policy; `LLM`:
the offline API on top.

One `step()`:
1. `plan = scheduler.plan(state)` - the same policy objects the simulator drives;
2. `state.begin_step(plan)` applies preemptions (their blocks are freed; they recompute
   prompt + generated tokens later) and admissions;
3. blocks are allocated on demand for the tokens the step writes, the decoders' last
   tokens and the prefill chunks are packed into one forward pass, and the rows that
   complete a prompt or decode are sampled;
4. `state.end_step(plan)` with the measured end time; stop conditions (EOS, stop token
   ids, stop strings) finish requests early; the measured step time goes to
   `scheduler.observe`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from ..core.engine_api import RequestOutput, SamplingParams, check_request_size, find_stop
from ..core.errors import ConfigError
from ..core.plan import StepFeedback
from ..core.request import DONE, Request
from ..policies import make_scheduler
from .kv_cache import BlockAllocator, token_capacity
from .loader import ModelConfig, read_config
from .tokenizer import Detokenizer, Tokenizer


class Sequence:
    """Engine-side data of one request (the `payload` of its `Request`)."""

    __slots__ = ("request_id", "token_ids", "prompt_len", "params", "generator", "blocks", "detok",
                 "text", "sent", "finish_reason", "stop_reason", "arrival", "token_times", "req",
                 "stop_ids", "hold", "min_ban")

    def __init__(self, request_id: str, prompt: list[int], params: SamplingParams, arrival: float):
        self.request_id = request_id
        self.token_ids = list(prompt)
        self.prompt_len = len(prompt)
        self.params = params
        self.generator = None
        self.blocks: list[int] = []
        self.detok = None
        self.text = ""
        self.sent = 0                 # characters of `text` already returned
        self.finish_reason = None
        self.stop_reason = None
        self.arrival = arrival        # engine clock, seconds
        self.token_times: list[float] = []
        self.req: Request | None = None
        self.stop_ids: frozenset = frozenset()
        self.min_ban: frozenset = frozenset()  # token ids masked before min_tokens
        self.hold = max((len(s) for s in params.stop), default=1) - 1  # chars a stop string could still claim

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]


@dataclass
class Completion:
    """One finished request of `LLM.generate`. Times in seconds."""

    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: object = None
    ttft: float = float("nan")
    itl: list[float] = field(default_factory=list)
    e2e: float = float("nan")
    preemptions: int = 0


class LLMEngine:
    """Implements `llmsched.core.engine_api.EngineCore` on a PyTorch model.

    `model`: a Hugging Face-format folder, or a `ModelConfig` for random weights (no
    tokenizer; benchmarks). KV cache: `num_blocks` if given, else `kv_cache_gb` on CPU
    (default 1 GiB, capped at what `max_num_seqs` full-length sequences could use), else
    free GPU memory x `gpu_memory_utilization` on CUDA. On CPU, `num_threads` sets torch's
    intra-op threads (process-wide); by default one core is left to the Python driver, as
    vLLM's CPU backend does (a thread waiting for a busy core slows every op)."""

    def __init__(self, model, *, scheduler: str = "sarathi", admission: str = "fcfs", b_max: int = 512,
                 k_max: int | None = None, kv_cache_gb: float | None = None, device: str = "cpu",
                 dtype=None, max_num_seqs: int = 256, block_size: int = 16,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.9,
                 enforce_eager: bool = False, seed: int = 0, num_blocks: int | None = None,
                 admission_options: dict | None = None, num_threads: int | None = None):
        from .runner import ModelRunner, set_cpu_threads  # noqa: PLC0415 - torch only from here on

        for name, v in (("b_max", b_max), ("max_num_seqs", max_num_seqs), ("block_size", block_size)):
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if isinstance(model, ModelConfig):
            self.config, model_dir, self.tokenizer = model, None, None
        else:
            self.config = read_config(model)
            model_dir = model
            self.tokenizer = Tokenizer.from_dir(model)
        cfg = self.config
        if max_model_len is None:
            max_model_len = cfg.max_position_embeddings
        if not isinstance(max_model_len, int) or max_model_len <= 0:
            raise ConfigError(f"max_model_len must be a positive integer, got {max_model_len!r}")
        self.max_model_len = max_model_len
        if not str(device).startswith("cuda"):
            set_cpu_threads(num_threads)
        self.runner = ModelRunner(cfg, model_dir, device=device, dtype=dtype, block_size=block_size,
                                  max_num_seqs=max_num_seqs, b_max=b_max, max_model_len=max_model_len,
                                  kv_cache_gb=kv_cache_gb, num_blocks=num_blocks,
                                  gpu_memory_utilization=gpu_memory_utilization,
                                  enforce_eager=enforce_eager, seed=seed)
        self.allocator = BlockAllocator(self.runner.num_blocks, block_size)
        self.kv_capacity = token_capacity(self.runner.num_blocks, block_size, max_num_seqs)
        self.scheduler = make_scheduler(scheduler, admission=admission, b_max=b_max, k_max=k_max,
                                        kv_capacity=self.kv_capacity, max_running=max_num_seqs,
                                        admission_options=admission_options)
        self.state = self.scheduler.new_state()
        self.max_num_seqs = max_num_seqs
        self.b_max, self.k_max = b_max, k_max
        self.eos_ids = frozenset(cfg.eos_token_ids)
        self._rng = random.Random(seed)
        self._requests: dict[str, Request] = {}
        self._next = 0
        self._perf0 = time.perf_counter_ns()
        self._wall0 = time.time()
        self.steps = 0
        self.busy_s = 0.0
        self.preemptions = 0
        self.last_step_s = 0.0
        self.last_forward_s = 0.0
        self.last_overhead_s = 0.0
        self.last_sampled = 0
        self.last_plan = None
        # the last step as the cost model sees it: (prefill tokens, decode tokens, decode
        # context, [(chunk, context)], sampled rows), the arguments of `CostModel.step_time`
        self.last_step_args: tuple | None = None
        self.step_log: list | None = None  # set to a list to record (start_s, duration_s, plan summary)

    # ---- clock -----------------------------------------------------------------------
    def now(self) -> float:
        """Engine clock (seconds since the engine started)."""
        return (time.perf_counter_ns() - self._perf0) / 1e9

    def _wall_to_engine(self, t: float) -> float:
        return t - self._wall0

    # ---- EngineCore ------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        """Queue a request. `arrival_time`: `time.time()` seconds (default: now)."""
        if request_id in self._requests:
            raise ConfigError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ConfigError("params must be a llmsched SamplingParams")
        prompt = list(prompt_token_ids)
        n = len(prompt)
        check_request_size(n, params.max_tokens, self.max_model_len, self.kv_capacity)
        vocab = self.config.vocab_size
        for t in prompt:
            if not isinstance(t, int) or not 0 <= t < vocab:
                raise ConfigError(f"request {request_id!r}: token id {t!r} is outside the vocabulary "
                                  f"(0..{vocab - 1})")
        if params.stop and self.tokenizer is None:
            raise ConfigError("stop strings need a tokenizer, and this model has none")
        now = self.now()
        arrival = now if arrival_time is None else min(now, self._wall_to_engine(arrival_time))
        seq = Sequence(request_id, prompt, params, arrival)
        seq.stop_ids = frozenset(params.stop_token_ids)
        if params.min_tokens:
            seq.min_ban = seq.stop_ids if params.ignore_eos else seq.stop_ids | self.eos_ids
        if not params.greedy:
            import torch  # noqa: PLC0415
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            seq.generator = torch.Generator(device=self.runner.device).manual_seed(seed)
        if self.tokenizer is not None:
            seq.detok = Detokenizer(self.tokenizer, n)
        r = Request(self._next, int(arrival * 1e9), n, params.max_tokens, payload=seq)
        self._next += 1
        seq.req = r
        self._requests[request_id] = r
        self.state.add(r)

    def abort_request(self, request_id: str) -> None:
        r = self._requests.pop(request_id, None)
        if r is None:
            return
        if r.phase != DONE:
            self.state.finish(r, max(self.state.now, int(self.now() * 1e9)))
        r.payload.finish_reason = "abort"
        self.allocator.free(r.payload.blocks)

    def has_unfinished_requests(self) -> bool:
        return not self.state.is_idle()

    def stats(self) -> dict:
        st = self.state
        return {
            "waiting": len(st.waiting), "running": st.n_running, "decoding": st.n_decoding,
            "kv_used_tokens": st.kv_used, "kv_capacity_tokens": self.kv_capacity,
            "kv_blocks_used": self.allocator.num_used, "kv_blocks_total": self.allocator.num_blocks,
            "block_size": self.allocator.block_size, "steps": self.steps, "busy_s": self.busy_s,
            "preemptions": self.preemptions, "last_step_ms": self.last_step_s * 1e3,
            "scheduler": self.scheduler.name, "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
        }

    def step(self) -> list[RequestOutput]:
        st = self.state
        if st.is_idle():
            return []
        t0 = time.perf_counter_ns()
        plan = self.scheduler.plan(st)
        self.last_plan = plan
        if plan.is_empty():
            return []
        start_ns = max(st.now, t0 - self._perf0)
        pf, dctx, pchunks, sampled = st.begin_step(plan, start_ns)
        self.last_step_args = (pf, plan.decode, dctx, pchunks, sampled)
        for r in plan.preempt:
            self.allocator.free(r.payload.blocks)
            self.preemptions += 1
        alloc = self.allocator
        decoders = st.decoders[:plan.decode]
        dec_seqs = []
        samplers = []
        for r in decoders:
            s = r.payload
            alloc.ensure(s.blocks, len(s.token_ids))
            dec_seqs.append(s)
            samplers.append(r)
        chunks = []
        for r, n in plan.prefill:
            s = r.payload
            start = r.prefilled
            alloc.ensure(s.blocks, start + n)
            last = start + n == r.prefill_target
            chunks.append((s, start, n, last))
            if last:
                samplers.append(r)
        params = [r.payload.params for r in samplers]
        gens = [r.payload.generator for r in samplers]
        banned = None
        for j, r in enumerate(samplers):   # min_tokens: no EOS / stop token before it
            s = r.payload
            if s.min_ban and len(s.token_ids) - s.prompt_len < s.params.min_tokens:
                if banned is None:
                    banned = [None] * len(samplers)
                banned[j] = s.min_ban
        self.last_sampled = len(samplers)
        tf = time.perf_counter_ns()
        tokens = self.runner.execute(dec_seqs, chunks, params, gens,
                                     banned=banned)  # returns host ints: synced
        t1 = time.perf_counter_ns()
        self.last_forward_s = (t1 - tf) / 1e9
        end_ns = max(t1 - self._perf0, start_ns + 1)
        st.end_step(plan, end_ns)
        t_end = end_ns / 1e9
        outputs = []
        stopped = []
        for r, tok in zip(samplers, tokens):
            out = self._emit(r, tok, t_end)
            if out.finished and r.phase != DONE:
                st.finish(r, end_ns)
                stopped.append(r)
            if out.finished:
                alloc.free(r.payload.blocks)
                self._requests.pop(r.payload.request_id, None)
            outputs.append(out)
        duration = (t1 - t0) / 1e9
        self.steps += 1
        self.busy_s += duration
        self.last_step_s = duration
        if self.step_log is not None:
            self.step_log.append((start_ns / 1e9, duration, plan.prefill_tokens, plan.decode,
                                  len(plan.prefill)))
        finished = st.finished + stopped if stopped else st.finished
        self.scheduler.observe(st, StepFeedback(start_ns / 1e9, duration, plan, finished,
                                                st.first_tokens, lambda: decoders,
                                                resumed=[r for r, _ in st.resumed]))
        # host work of the step outside the forward pass (planning, state, stop checks)
        self.last_overhead_s = (time.perf_counter_ns() - t0) / 1e9 - self.last_forward_s
        return outputs

    def _emit(self, r: Request, tok: int, t: float) -> RequestOutput:
        s = r.payload
        p = s.params
        s.token_ids.append(tok)
        s.token_times.append(t)
        reason = None
        by_token = False
        # min_tokens (as in vLLM): the sampler cannot draw EOS or a stop token id as one of
        # the first min_tokens tokens (should every token be masked, such a draw is no
        # stop either), and stop strings are checked from the min_tokens-th token on
        n_out = len(s.token_ids) - s.prompt_len
        checks = n_out >= p.min_tokens
        by_id = n_out > p.min_tokens
        if by_id and tok in self.eos_ids and not p.ignore_eos:
            reason, by_token = "stop", True
        elif by_id and tok in s.stop_ids:
            reason, by_token, s.stop_reason = "stop", True, tok
        elif r.phase == DONE:
            reason = "length"
        if s.detok is not None:
            if not by_token:
                piece = s.detok.step(s.token_ids, final=reason is not None)
                if piece:
                    s.text += piece
                    if p.stop and checks:
                        cut = self._find_stop(s, len(piece))
                        if cut is not None:
                            reason = "stop"
            elif reason is not None:  # flush a held-back partial character, without the stop token
                s.token_ids.pop()
                s.text += s.detok.step(s.token_ids, final=True)
                s.token_ids.append(tok)
        if reason is not None:
            s.finish_reason = reason
            upto = len(s.text)
        else:
            upto = max(s.sent, len(s.text) - s.hold)
        new_text = s.text[s.sent:upto]
        s.sent = upto
        return RequestOutput(request_id=s.request_id, new_token_ids=[tok], new_text=new_text,
                             finished=reason is not None, finish_reason=reason,
                             prompt_tokens=s.prompt_len, output_tokens=len(s.token_ids) - s.prompt_len,
                             stop_reason=s.stop_reason if reason == "stop" else None)

    @staticmethod
    def _find_stop(s: Sequence, new_chars: int) -> int | None:
        """Cut `s.text` at the earliest stop string that the new characters complete."""
        best = find_stop(s.text, new_chars, s.params.stop)
        if best is None:
            return None
        s.text = s.text[:best[0]]
        s.sent = min(s.sent, best[0])
        s.stop_reason = best[1]
        return best[0]

    # ---- helpers -----------------------------------------------------------------------
    def set_scheduler(self, scheduler: str = "sarathi", admission: str = "fcfs", b_max: int | None = None,
                      k_max: int | None = None, admission_options: dict | None = None) -> None:
        """Swap the policy (only while idle); the model and the KV cache stay."""
        if not self.state.is_idle():
            raise RuntimeError("the scheduler can only change while no request is in the engine")
        self.b_max = b_max or self.b_max
        self.k_max = k_max
        self.scheduler = make_scheduler(scheduler, admission=admission, b_max=self.b_max, k_max=k_max,
                                        kv_capacity=self.kv_capacity, max_running=self.max_num_seqs,
                                        admission_options=admission_options)
        self.state = self.scheduler.new_state()

    def sequence(self, request_id: str) -> Sequence | None:
        r = self._requests.get(request_id)
        return r.payload if r is not None else None


def _completion(s: Sequence) -> Completion:
    times = s.token_times
    return Completion(request_id=s.request_id, prompt_token_ids=s.token_ids[:s.prompt_len], text=s.text,
                      token_ids=s.output_ids, finish_reason=s.finish_reason, stop_reason=s.stop_reason,
                      ttft=times[0] - s.arrival if times else float("nan"),
                      itl=[b - a for a, b in zip(times, times[1:])],
                      e2e=times[-1] - s.arrival if times else float("nan"),
                      preemptions=s.req.preemptions if s.req is not None else 0)


class LLM:
    """Offline batch generation: `LLM(model_dir).generate(prompts, params)`."""

    def __init__(self, model, scheduler: str = "sarathi", b_max: int = 512, k_max: int | None = None,
                 kv_cache_gb: float | None = None, device: str = "cpu", dtype=None,
                 max_num_seqs: int = 256, **engine_options):
        self.engine = LLMEngine(model, scheduler=scheduler, b_max=b_max, k_max=k_max,
                                kv_cache_gb=kv_cache_gb, device=device, dtype=dtype,
                                max_num_seqs=max_num_seqs, **engine_options)
        self.tokenizer = self.engine.tokenizer
        self._n = 0

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("text prompts need a tokenizer.json in the model folder; "
                                  "pass token id lists instead")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise ConfigError("a prompt must be a string or a list of token ids")

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None) -> list[Completion]:
        """Generate for every prompt (a string, a token-id list, or a list of either);
        returns completions in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ConfigError(f"got {len(plist)} sampling params for {len(prompts)} prompts")
        eng = self.engine
        ids = []
        seqs = {}
        try:
            for prompt, p in zip(prompts, plist):
                rid = f"gen-{self._n}"
                self._n += 1
                eng.add_request(rid, self.encode(prompt), p)
                ids.append(rid)
                seqs[rid] = eng.sequence(rid)
            idle_steps = 0
            while eng.has_unfinished_requests():
                eng.step()
                if eng.last_plan is not None and eng.last_plan.is_empty():
                    idle_steps += 1
                    if idle_steps > 3:
                        raise RuntimeError("the scheduler planned no work although requests are waiting")
                else:
                    idle_steps = 0
        except BaseException:
            for rid in ids:
                eng.abort_request(rid)
            raise
        return [_completion(seqs[rid]) for rid in ids]
