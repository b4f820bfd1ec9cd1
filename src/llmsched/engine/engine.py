"""`LLMEngine`: a real `EngineCore` whose steps are the plans of a llmsched policy; `LLM`:
the offline API on top.

`LLMEngine` is a `runtime.StepDriver` (the virtual GPU's step loop too) whose executor is
the model: for one step, the driver plans (the same policy objects the simulator drives)
and applies preemptions and admissions to the state; the executor allocates KV blocks on
demand for the tokens the step writes, packs the decoders' last tokens and the prefill
chunks into one forward pass and samples the rows that complete a prompt or decode; the
driver then applies the step with its measured end, runs the stop checks (EOS, stop ids,
stop strings; `runtime.output.Sequence`) and reports the measured time to the policy.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from dataclasses import dataclass, field

from ..core.checks import as_int, check_text, keyword_names, whole_as_int
from ..core.clock import wall_stamp_ns
from ..core.constraints import check_prefix_block_size
from ..core.cost import make_cost_model
from ..core.engine_api import (
    GPU_MEMORY_UTILIZATION,
    LLM_MAX_NUM_SEQS,
    DefaultMaxModelLen,
    SamplingParams,
    check_request_size,
    is_auto_max_model_len,
)
from ..core.errors import ConfigError, check_known
from ..core.plan import StepPlan
from ..core.prefix_cache import held_ids, token_block_ids
from ..core.profile import check_profile_layers
from ..core.request import Request
from ..policies.spec import SchedulerSpec
from ..runtime.driver import NS, StepBatch, StepDriver
from ..runtime.output import PieceFn
from ..runtime.output import Sequence as _Sequence
from .kv_cache import BlockAllocator, token_capacity
from .loader import ModelConfig, generation_defaults, generation_stop_ids, read_config
from .tokenizer import Detokenizer, Tokenizer


class Sequence(_Sequence):
    """Engine-side data of one request: its tokens, KV blocks, sampler and timings, on top
    of the driver's text and stop state."""

    __slots__ = ("token_ids", "generator", "blocks", "shared", "detok", "arrival", "token_times")

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        arrival: float,
        eos_ids: frozenset,
        config_stop_ids: frozenset = frozenset(),
    ):
        super().__init__(request_id, len(prompt), params, eos_ids, config_stop_ids)
        self.token_ids = list(prompt)
        self.generator = None
        self.blocks: list[int] = []  # block table: physical block of positions i*bs .. (i+1)*bs - 1
        self.shared: set[int] = set()  # table indices whose block belongs to the prefix cache
        self.detok = None
        self.arrival = arrival  # engine clock, seconds
        self.token_times: list[float] = []

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]


class ModelExecutor:
    """Executes a step on the model: KV blocks on demand, one packed forward pass."""

    def __init__(self, runner, allocator: BlockAllocator, perf0: int, cached_blocks: dict[int, int] | None = None):
        self.runner = runner
        self.allocator = allocator
        self.perf0 = perf0
        self.forward_s = 0.0
        self.cached_blocks = cached_blocks  # prefix caching: cached block id -> physical block

    def execute(self, batch: StepBatch) -> tuple[int, list[int]]:
        alloc = self.allocator
        dec_seqs = []
        for r in batch.decoders:
            s = r.payload
            alloc.ensure(s.blocks, len(s.token_ids))
            dec_seqs.append(s)
        chunks = []
        rows_wanted = []  # per chunk: None or (lo, hi, k), see ModelRunner.execute
        for r, first, n, last in batch.prefill:
            s = r.payload
            if not s.blocks and r.cached:  # admitted on a cached prefix: its blocks head the table
                phys = self.cached_blocks
                s.blocks = [phys[k] for k in held_ids(r.cached)]
                s.shared = set(range(len(s.blocks)))
            alloc.ensure(s.blocks, first + n)
            k = s.params.prompt_logprobs
            want = None
            # the rows of prompt positions p < prompt_len - 1 give token p + 1's logprob; a
            # recomputed prompt (after a preemption) has them already
            if k is not None:
                done = len(s.prompt_lps) - 1  # positions whose next token's logprob is known
                if first <= done < min(first + n, s.prompt_len - 1):
                    want = (done, min(first + n, s.prompt_len - 1), k)
            rows_wanted.append(want)
            chunks.append((s, first, n, last))
        prompt_rows = rows_wanted if any(w is not None for w in rows_wanted) else None
        seqs = [r.payload for r in batch.samplers]
        banned = [s.banned_ids() for s in seqs]  # min_tokens: no EOS / stop id before it
        params = [s.params for s in seqs]
        history = None  # penalties: the tokens so far
        if any(p.penalized for p in params):
            history = [(s.token_ids, s.prompt_len) if s.params.penalized else None for s in seqs]
        want_lp = any(p.logprobs is not None for p in params)
        lps: list | None = [] if want_lp else None
        plps: list | None = [] if prompt_rows is not None else None
        tf = time.perf_counter_ns()
        tokens = self.runner.execute(
            dec_seqs,
            chunks,
            params,
            [s.generator for s in seqs],
            banned=banned if any(b is not None for b in banned) else None,
            history=history,
            logprobs_out=lps,
            prompt_rows=prompt_rows,
            prompt_out=plps,
        )
        t1 = time.perf_counter_ns()  # tokens are host ints: the device is synced
        if plps:
            for (s, *_), got in zip(chunks, plps):
                if got is not None:
                    s.prompt_lps.extend(got)
        if lps:
            for s, lp in zip(seqs, lps):
                s.logprob = lp
        self.forward_s = (t1 - tf) / 1e9
        return max(t1 - self.perf0, batch.start_ns + 1), tokens


# While a policy job runs on its worker thread (pure Python: a region solve), the GIL's
# switch interval is 0.1 ms instead of 5: each torch op of a step gives the GIL up and
# waited up to 5 ms to get it back (an inter-token latency of 1-2 ms on the tiny model
# reached 108 ms with the refit on the worker at 5 ms, 12.5 ms at 0.1 ms: docs/engine.md).
_JOB_SWITCH_S = 1e-4
_job_lock = threading.Lock()
_jobs_running = 0
_saved_switch = 0.005


def _run_job(fn):
    global _jobs_running, _saved_switch
    with _job_lock:
        if _jobs_running == 0:
            _saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_switch, _JOB_SWITCH_S))
        _jobs_running += 1
    try:
        return fn()
    finally:
        with _job_lock:
            _jobs_running -= 1
            if _jobs_running == 0:
                sys.setswitchinterval(_saved_switch)


@dataclass
class Completion:
    """One finished request of `LLM.generate`. Times in seconds."""

    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: object = None
    prompt_logprobs: list | None = None  # see RequestOutput.prompt_logprobs
    # with SamplingParams.logprobs: per generated token, (its logprob, [(token id, logprob),
    # ...] the top `logprobs`), as RequestOutput.logprobs streams them (vLLM's
    # CompletionOutput.logprobs)
    logprobs: list | None = None
    ttft: float = float("nan")
    itl: list[float] = field(default_factory=list)
    e2e: float = float("nan")
    preemptions: int = 0


class LLMEngine(StepDriver):
    """Implements `llmsched.core.engine_api.EngineCore` on a PyTorch model.

    `model`: a Hugging Face-format folder, or a `ModelConfig` for random weights (no
    tokenizer; benchmarks). KV cache: `num_blocks` if given, else `kv_cache_gb` on CPU
    (default 1 GiB, capped at what `max_num_seqs` full-length sequences could use), else
    free GPU memory x `gpu_memory_utilization` on CUDA. On CPU, `num_threads` sets torch's
    intra-op threads (process-wide); by default one core is left to the Python driver, as
    vLLM's CPU backend does (a thread waiting for a busy core slows every op).

    `scheduler`: a batch policy name (with `admission` (default fcfs), `b_max` (512),
    `k_max` (None: no cap), `admission_options`, `prefix_caching` (False)), or a whole
    `SchedulerSpec`, whose values these are then (its `max_running`, if set, is
    `max_num_seqs`; its `block_size` is `block_size`): any of them given here as well must
    equal the spec's, or it is a ConfigError naming both (one of the two would be lost);
    the KV capacity (`kv_capacity`) is always the engine's. `max_num_seqs`: running
    requests (default 256). `block_size`: tokens per KV block, the prefix cache's unit
    too (default 16). `prefix_caching`: reuse the KV blocks of computed prompt prefixes,
    shared between sequences (see `kv_cache`); block ids come from the prompt's token
    ids. `tokenizer`: a folder with tokenizer.json (or the file) used instead of the model folder's, as vLLM's
    `tokenizer` (prompts, output text and stop strings all use it). `cost_model`: a cost
    model or its spec (`profile:PATH`, `paper`, ...; `llmsched.core.cost.make_cost_model`)
    bound to the scheduler, now and after each `set_scheduler`, as the simulator binds
    its own: the policies that reason about step times (adaptive, TWP, DynamicBatch) read
    them from it; without one, adaptive plans with `paper` and TWP and DynamicBatch learn
    the measured step times. It never times the engine's steps. A policy's jobs
    (adaptive's region refits) run on a worker thread, their results installed between
    steps; `close()` stops it."""

    def __init__(
        self,
        model,
        *,
        scheduler: str | SchedulerSpec = "sarathi",
        admission: str | None = None,
        b_max: int | None = None,
        k_max: int | None = None,
        kv_cache_gb: float | None = None,
        device: str = "cpu",
        dtype=None,
        max_num_seqs: int | None = None,
        block_size: int | None = None,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
        enforce_eager: bool = False,
        seed: int = 0,
        num_blocks: int | None = None,
        admission_options: dict | None = None,
        num_threads: int | None = None,
        prefix_caching: bool | None = None,
        tokenizer=None,
        cost_model=None,
    ):
        from .runner import ModelRunner, set_cpu_threads  # noqa: PLC0415 - torch only from here on

        if cost_model is not None:
            cost_model = make_cost_model(cost_model)  # a bad spec fails before the model loads
        if not isinstance(scheduler, (str, SchedulerSpec)):
            raise ConfigError(f"scheduler must be a policy name or a SchedulerSpec, got {type(scheduler).__name__}")
        if isinstance(scheduler, SchedulerSpec):
            spec = scheduler
            # a value given in both places must agree: one of them was silently dropped
            # (prefix_caching=True left caching off, b_max and k_max were the spec's)
            for name, given, spec_name, theirs in (
                ("admission", admission, "admission", spec.admission),
                ("b_max", b_max, "b_max", spec.b_max),
                ("k_max", k_max, "k_max", spec.k_max),
                ("admission_options", admission_options, "admission_options", spec.admission_options),
                ("prefix_caching", prefix_caching, "prefix_caching", spec.prefix_caching),
                ("max_num_seqs", max_num_seqs, "max_running", spec.max_running),
                ("block_size", block_size if as_int(block_size) is not None else None, "block_size", spec.block_size),
            ):
                # (a spec's max_running None sets nothing; its k_max None is no cap)
                if given is not None and given != theirs and not (theirs is None and spec_name == "max_running"):
                    raise ConfigError(
                        f"{name} {given!r} differs from the SchedulerSpec's {spec_name} {theirs!r}: "
                        "give it in one place"
                    )
            max_num_seqs = spec.max_running or max_num_seqs
            if block_size is None:
                block_size = spec.block_size
        else:
            block_size = SchedulerSpec.block_size if block_size is None else block_size
            spec = SchedulerSpec(
                policy=scheduler,
                admission="fcfs" if admission is None else admission,
                b_max=512 if b_max is None else b_max,
                k_max=k_max,
                admission_options=admission_options or {},
                prefix_caching=False if prefix_caching is None else prefix_caching,
            )
        if max_num_seqs is None:
            max_num_seqs = LLM_MAX_NUM_SEQS
        b_max = spec.b_max
        for name, v in (("b_max", b_max), ("max_num_seqs", max_num_seqs)):
            n = as_int(whole_as_int(v))  # (whole floats too, as the scheduler's Constraints take them)
            if n is None or n <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        block_size = check_prefix_block_size(block_size)  # the simulator's rule and limit
        b_max, max_num_seqs, block_size = int(b_max), int(max_num_seqs), int(block_size)
        if isinstance(model, ModelConfig):
            self.config, model_dir, self.tokenizer = model, None, None
        else:
            self.config = read_config(model)
            model_dir = model
            self.tokenizer = Tokenizer.from_dir(model) if tokenizer is None else None
        if tokenizer is not None:
            self.tokenizer = Tokenizer.from_dir(tokenizer, required=True)
        cfg = self.config
        self._model_name = "(a ModelConfig)" if model_dir is None else str(model_dir)
        if cost_model is not None:
            self._check_cost_layers(cost_model)  # before the model loads
        longest = cfg.max_len
        auto = is_auto_max_model_len(max_model_len)
        if max_model_len is None or auto:
            max_model_len = longest  # (auto: the cache is sized for it, then the length cut to the cache)
        if as_int(max_model_len) is None or max_model_len <= 0:
            raise ConfigError(f"max_model_len must be a positive integer or 'auto' (-1), got {max_model_len!r}")
        if not isinstance(max_model_len, int):
            max_model_len = int(max_model_len)  # a numpy integer
        if max_model_len > longest:
            if not isinstance(max_model_len, DefaultMaxModelLen):
                # positions beyond the model's were never trained (vLLM refuses them too)
                raise ConfigError(
                    f"max_model_len (--max-model-len) {max_model_len} is more than the model's longest "
                    f"sequence, {longest} (max_position_embeddings in its config.json)"
                )
            max_model_len = longest
        max_model_len = self.max_model_len = int(max_model_len)
        if not str(device).startswith("cuda"):
            set_cpu_threads(num_threads)
        self.runner = ModelRunner(
            cfg,
            model_dir,
            device=device,
            dtype=dtype,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            b_max=b_max,
            max_model_len=max_model_len,
            kv_cache_gb=kv_cache_gb,
            num_blocks=num_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            seed=seed,
        )
        self.allocator = BlockAllocator(self.runner.num_blocks, block_size)
        self.kv_capacity = token_capacity(self.runner.num_blocks, block_size, max_num_seqs, self.runner.kv_size_knob)
        if auto:  # a sequence reaches what the cache holds plus its last token, which takes no slot
            # (the runner's too: the profiler plans its contexts by it)
            self.max_model_len = self.runner.max_model_len = min(longest, self.kv_capacity + 1)
        self.spec = spec.replace(kv_capacity=self.kv_capacity, max_running=max_num_seqs, block_size=block_size)
        super().__init__(self.spec.build())
        self._pool = None  # one worker thread for the policy's jobs (adaptive's region refits)
        self._job = None  # (policy, key, future) of the job it runs
        self._defer_jobs()
        self.cost_model = None
        if cost_model is not None:
            self.bind_cost_model(cost_model)
        self._cached_blocks: dict[int, int] = {}  # prefix cache: block id -> physical block
        self._hook_prefix_cache()
        self.max_num_seqs = max_num_seqs
        self.eos_ids = frozenset(cfg.eos_token_ids)
        # a --generation-config PATH file's other EOS ids (loader.generation_stop_ids, set by
        # LLM and the server): every request stops on them unless it sets ignore_eos
        self.config_stop_ids: frozenset = frozenset()
        self._rng = random.Random(int(seed))  # checked by the runner; a numpy integer is no Random seed
        self._perf0 = time.perf_counter_ns()
        self._t0 = 0
        self.executor = ModelExecutor(self.runner, self.allocator, self._perf0, self._cached_blocks)
        self.last_forward_s = 0.0
        self.last_overhead_s = 0.0
        self.last_sampled = 0
        # the last step as the cost model sees it: (prefill tokens, decode tokens, decode
        # context, [(chunk, context)], sampled rows), the arguments of `CostModel.step_time`
        self.last_step_args: tuple | None = None
        self.step_log: list | None = None  # set to a list to record (start_s, duration_s, plan summary)

    # ---- clock -----------------------------------------------------------------------
    def now(self) -> float:
        """Engine clock (seconds since the engine started)."""
        return (time.perf_counter_ns() - self._perf0) / 1e9

    def now_ns(self) -> int:
        return time.perf_counter_ns() - self._perf0

    @property
    def busy_s(self) -> float:
        return self.busy_ns / NS

    # ---- EngineCore ------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        *,
        arrival_ns: int | None = None,
    ) -> None:
        """Queue a request. `arrival_time`: `time.time()` seconds; `arrival_ns`: a time on
        the engine's clock (`now_ns()`); default: now. A later time counts as now."""
        if request_id in self._requests:
            raise ConfigError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ConfigError("params must be a llmsched SamplingParams")
        if isinstance(prompt_token_ids, (str, bytes, bytearray)):  # (iterated, its characters were the ids)
            raise ConfigError(
                f"request {request_id!r}: prompt_token_ids must be a list of token ids, not "
                f"{type(prompt_token_ids).__name__} (encode text with the tokenizer, or use LLM.generate)"
            )
        prompt = [t if (i := as_int(t)) is None else i for t in prompt_token_ids]
        n = len(prompt)
        check_request_size(n, params.max_tokens, self.max_model_len, self.kv_capacity)
        vocab = self.config.vocab_size
        if not (
            all(isinstance(t, int) for t in prompt) and min(prompt, default=0) >= 0 and max(prompt, default=0) < vocab
        ):
            bad = next(t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab)  # name the first
            raise ConfigError(f"request {request_id!r}: token id {bad!r} is outside the vocabulary (0..{vocab - 1})")
        for t in params.stop_token_ids or ():
            if not 0 <= t < vocab:  # (it could never be sampled: a stop that silently never stops)
                raise ConfigError(
                    f"request {request_id!r}: stop token id {t} is outside the vocabulary (0..{vocab - 1})"
                )
        for t in params.logit_bias or ():
            if t >= vocab:  # (the sampler would skip it: a bias that silently does nothing)
                raise ConfigError(
                    f"request {request_id!r}: logit_bias token id {t} is outside the vocabulary (0..{vocab - 1})"
                )
        if params.stop and self.tokenizer is None:
            raise ConfigError("stop strings need a tokenizer, and this model has none")
        now_ns = self.now_ns()
        if arrival_ns is None and arrival_time is not None:
            arrival_ns = wall_stamp_ns(arrival_time, now_ns)
        arrival_ns = now_ns if arrival_ns is None else min(now_ns, int(arrival_ns))
        arrival = arrival_ns / 1e9
        seq = Sequence(request_id, prompt, params, arrival, self.eos_ids, self.config_stop_ids)
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            # all 64 bits (torch's CPU generator would keep the low 32): see sampler.py
            seq.generator = random.Random(seed & 0xFFFF_FFFF_FFFF_FFFF)
        if self.tokenizer is not None:
            seq.detok = Detokenizer(self.tokenizer, n)
        if params.prompt_logprobs is not None:
            seq.prompt_lps = [None]  # the first token has no logprob
        r = self._register(seq, arrival_ns)
        pc = self.state.prefix
        if pc is not None:
            r.blocks = token_block_ids(prompt, pc.block_size, params.cache_salt)
            # the prompt logprobs need every prompt row computed: no cached prefix
            r.reuse_prefix = params.prompt_logprobs is None
        self.state.add(r)

    def _release(self, r: Request) -> None:
        s = r.payload
        if s.shared:  # the prefix cache's blocks stay (it frees them when it evicts them)
            own = [b for i, b in enumerate(s.blocks) if i not in s.shared]
            s.blocks.clear()
            s.shared = set()
            self.allocator.free(own)
        else:
            self.allocator.free(s.blocks)

    # ---- prefix caching ----------------------------------------------------------------
    def _hook_prefix_cache(self) -> None:
        """Give a new state's prefix cache the physical side of its blocks."""
        pc = self.state.prefix
        if pc is None:
            return
        self.state.on_cached = self._on_cached
        pc.on_evict = self._on_evict

    def _on_cached(self, r: Request, j: int) -> None:
        """Block j of r's prompt is computed and now the cache's: it stays in r's table."""
        s = r.payload
        self._cached_blocks[r.blocks[j]] = s.blocks[j]
        s.shared.add(j)

    def _on_evict(self, key: int) -> None:
        self.allocator.free_block(self._cached_blocks.pop(key))

    def stats(self) -> dict:
        return {
            **self.counters(),
            "kv_blocks_used": self.allocator.num_used,
            "kv_blocks_total": self.allocator.num_blocks,
            "block_size": self.allocator.block_size,
            "last_step_ms": self.last_step_s * 1e3,
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
        }

    # ---- the step (the loop itself is StepDriver.step) ------------------------------
    def _begin(self) -> tuple[StepPlan, int] | None:
        self._t0 = time.perf_counter_ns()
        job = self._job
        if job is not None and job[2].done():
            self._job = None
            job[0].install_job(job[1], job[2].result())  # (a solve's error is raised here)
        plan = self.scheduler.plan(self.state)
        if self._job is None and self._take_job is not None:
            self._start_job()
        self.last_plan = plan
        if plan.is_empty():
            return None
        return plan, max(self.state.now, self._t0 - self._perf0)

    def stalled(self) -> bool:
        # a policy job in flight (adaptive's refit) changes the region, and so the plan, once installed
        return super().stalled() and self._job is None

    # ---- policy jobs off the step loop ---------------------------------------------
    def _defer_jobs(self) -> None:
        """A policy with jobs (adaptive's region refits, 0.13-0.23 s a solve: docs/engine.md) leaves
        them to the engine, which runs them on a worker thread: run inside `plan`, every
        request in the step waited for them."""
        self._take_job = getattr(self.scheduler.batch, "take_job", None)  # (looked up once, not per step)
        if self._take_job is not None:
            self.scheduler.batch.defer_jobs = True

    def _start_job(self) -> None:
        job = self._take_job()
        if job is None:
            return
        batch = self.scheduler.batch
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="llmsched-policy-job")
        key, fn = job
        self._job = (batch, key, self._pool.submit(_run_job, fn))

    def close(self) -> None:
        """Stop the policy's worker thread (a job running ends on its own, its result
        dropped). The engine still works: a later job starts another thread."""
        job, self._job = self._job, None
        if job is not None:  # (its key is solved again when next wanted)
            job[0].drop_job(job[1])
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _on_token(self, seq: Sequence, tok: int, t: float) -> None:
        seq.token_ids.append(tok)
        seq.token_times.append(t)

    def _piece(self, seq: Sequence, tok: int) -> PieceFn | None:
        detok = seq.detok
        if detok is None:
            return None
        ids = seq.token_ids
        return lambda final, drop: detok.step(ids[:-1] if drop else ids, final=final)

    def _after_step(self, end: int) -> None:
        batch = self.last_batch
        self.last_step_args = batch.cost_args
        self.last_sampled = len(batch.samplers)
        self.last_forward_s = self.executor.forward_s
        if self.step_log is not None:
            plan = batch.plan
            self.step_log.append(
                (batch.start_ns / 1e9, self.last_step_s, plan.prefill_tokens, plan.decode, len(plan.prefill))
            )
        # host work of the step outside the forward pass (planning, state, stop checks)
        self.last_overhead_s = (time.perf_counter_ns() - self._t0) / 1e9 - self.last_forward_s

    # ---- helpers -----------------------------------------------------------------------
    def set_scheduler(
        self,
        scheduler: str = "sarathi",
        admission: str = "fcfs",
        b_max: int | None = None,
        k_max: int | None = None,
        admission_options: dict | None = None,
    ) -> None:
        """Swap the policy (only while idle); the model, the KV cache and the bound cost
        model stay."""
        if not self.state.is_idle():
            raise RuntimeError("the scheduler can only change while no request is in the engine")
        self.spec = self.spec.replace(
            policy=scheduler,
            admission=admission,
            b_max=b_max or self.b_max,
            k_max=k_max,
            admission_options=admission_options or {},
        )
        self.scheduler = self.spec.build()
        self._job = None  # the old policy's job: its result is dropped
        self._defer_jobs()
        if self.cost_model is not None:
            self.scheduler.bind_cost_model(self.cost_model)
        pc = self.state.prefix
        if pc is not None:  # the old cache's blocks go back to the pool
            pc.evict(pc.n_free)
        self.state = self.scheduler.new_state()
        self._hook_prefix_cache()

    def bind_cost_model(self, cost) -> None:
        """Bind `cost` (a cost model or its spec) to the scheduler, and to every scheduler
        `set_scheduler` builds from now on (see the class's `cost_model`)."""
        cost = make_cost_model(cost)
        self._check_cost_layers(cost)
        self.cost_model = cost
        self.scheduler.bind_cost_model(cost)

    def _check_cost_layers(self, cost) -> None:
        """A profile of the user's own measured on a model of another layer count is refused:
        the policies that read step times (adaptive, TWP, DynamicBatch) would plan with that
        model's."""
        check_profile_layers(cost, self.config.num_layers, "--cost-model profile:", self._model_name)

    @property
    def b_max(self) -> int:
        return self.scheduler.constraints.b_max  # (the spec's as an int: it may be 64.0)

    @property
    def k_max(self) -> int | None:
        return self.scheduler.constraints.k_max


def _completion(s: Sequence, logprobs: list | None) -> Completion:
    times = s.token_times
    return Completion(
        request_id=s.request_id,
        prompt_token_ids=s.token_ids[: s.prompt_len],
        text=s.text,
        token_ids=s.output_ids,
        finish_reason=s.finish_reason,
        stop_reason=s.stop_reason,
        prompt_logprobs=s.prompt_lps,
        logprobs=logprobs,
        ttft=times[0] - s.arrival if times else float("nan"),
        itl=[b - a for a, b in zip(times, times[1:])],
        e2e=times[-1] - s.arrival if times else float("nan"),
        preemptions=s.req.preemptions if s.req is not None else 0,
    )


def _array_rows(x, ndims: tuple[int, ...]):
    """A numpy integer array of one of `ndims` dimensions as (nested) lists of ints; None
    for anything else. Raises ConfigError for another array."""
    ndim = getattr(x, "ndim", None)
    dtype = getattr(x, "dtype", None)
    if ndim is None or dtype is None or not hasattr(x, "tolist"):
        return None
    if ndim not in ndims or getattr(dtype, "kind", None) not in ("i", "u"):
        raise ConfigError(
            f"a prompt array must be of integer token ids, {' or '.join(f'{n}-D' for n in ndims)}; "
            f"got a {ndim}-D {dtype} array"
        )
    return x.tolist()


class LLM:
    """Offline batch generation: `LLM(model_dir).generate(prompts, params)`."""

    def __init__(
        self,
        model,
        scheduler: str | SchedulerSpec = "sarathi",
        b_max: int | None = None,
        k_max: int | None = None,
        kv_cache_gb: float | None = None,
        device: str = "cpu",
        dtype=None,
        max_num_seqs: int | None = None,
        generation_config: str = "auto",
        override_generation_config: dict | None = None,
        **engine_options,
    ):
        known = set(keyword_names(LLMEngine)) - {"model"}
        check_known("LLM option", engine_options, known)
        # as vLLM's LLM: generate() without params uses the model's generation_config.json
        # defaults (auto), another folder's (a path), or SamplingParams' own (vllm), with
        # override_generation_config's on top
        self.sampling_defaults = generation_defaults(model, generation_config, override_generation_config)
        stop_ids = generation_stop_ids(model, generation_config)  # (checked before the model loads)
        self.engine = LLMEngine(
            model,
            scheduler=scheduler,
            b_max=b_max,
            k_max=k_max,
            kv_cache_gb=kv_cache_gb,
            device=device,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            **engine_options,
        )
        self.engine.config_stop_ids = frozenset(stop_ids)
        self.tokenizer = self.engine.tokenizer
        self._n = 0

    def get_default_sampling_params(self) -> SamplingParams:
        """The params generate() uses when given none: SamplingParams with the model's
        generation_config.json defaults (`sampling_defaults`), as vLLM's method of this name."""
        return SamplingParams(**self.sampling_defaults)

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("text prompts need a tokenizer.json in the model folder; pass token id lists instead")
            return self.tokenizer.encode(check_text(prompt, "a prompt"))
        rows = _array_rows(prompt, (1,))
        if rows is not None:
            return rows
        if isinstance(prompt, (list, tuple)) and all(as_int(t) is not None for t in prompt):
            return [int(t) for t in prompt]
        raise ConfigError("a prompt must be a string or a list of token ids")

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None) -> list[Completion]:
        """Generate for every prompt (a string, a token-id list, or a list of either; a 1-D
        numpy integer array is one prompt of token ids, a 2-D one a prompt per row);
        returns completions in prompt order."""
        rows = _array_rows(prompts, (1, 2))
        if rows is not None:
            prompts = [rows] if prompts.ndim == 1 else rows
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and as_int(prompts[0]) is not None
        ):
            prompts = [prompts]  # one prompt: a string, or a list or tuple of token ids
        if not isinstance(prompts, (list, tuple)):
            raise ConfigError(
                f"prompts must be a string, a list of token ids or a list of prompts, got {type(prompts).__name__}"
            )
        prompts = list(prompts)
        if params is None:
            params = self.get_default_sampling_params()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ConfigError(f"got {len(plist)} sampling params for {len(prompts)} prompts")
        eng = self.engine
        ids = []
        seqs = {}
        lps: dict[str, list] = {}  # request id -> its tokens' logprobs (SamplingParams.logprobs)
        try:
            for prompt, p in zip(prompts, plist):
                rid = f"gen-{self._n}"
                self._n += 1
                eng.add_request(rid, self.encode(prompt), p)
                ids.append(rid)
                seqs[rid] = eng.sequence(rid)
                if p.logprobs is not None:
                    lps[rid] = []
            idle_steps = 0
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.logprobs is not None and o.request_id in lps:
                        lps[o.request_id].extend(o.logprobs)
                if eng.stalled():  # (the server's test too: `server.async_engine`)
                    idle_steps += 1
                    if idle_steps > 3:
                        raise RuntimeError(
                            f"the batch policy {eng.scheduler.batch.name!r} planned no work although "
                            "requests are waiting"
                        )
                else:
                    idle_steps = 0
        except BaseException:
            for rid in ids:
                eng.abort_request(rid)
            raise
        return [_completion(seqs[rid], lps.get(rid)) for rid in ids]
