"""Model runner: one step's sequences -> packed tensors -> one forward pass -> sampled tokens.

It owns the model, the KV cache tensors and, on CUDA, the decode CUDA graphs. The engine
owns the block tables (plain lists, `kv_cache.BlockAllocator`) and hands them in.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from ..core.checks import as_int, as_real
from ..core.engine_api import GPU_MEMORY_UTILIZATION, MAX_KV_CACHE_GB, MAX_SEED, MAX_THREADS, check_kv_cache_gb  # noqa: F401 (the limits the engine shares)
from ..core.errors import ConfigError
from .attention import AttnMeta, PrefillChunk
from .cpu_kernel import decode_kernel
from .loader import ModelConfig, check_weights, load_weights
from .model import CausalLM
from .sampler import logprob_entries, sample

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def _mib(n: float) -> str:
    """A size for messages: MiB, or bytes below 1 MiB (0.0 MiB said nothing)."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):,.1f} MiB"
    n = int(n)
    return f"{n:,} byte{'' if n == 1 else 's'}"


def _gib(n: float) -> str:
    """A size for messages: GiB from 1 GiB up, else as `_mib`."""
    return f"{n / (1 << 30):,.1f} GiB" if n >= 1 << 30 else _mib(n)


def physical_memory() -> int | None:
    """The machine's physical memory in bytes, or None where the OS does not say."""
    try:
        n = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return n if n > 0 else None


# what torch's RuntimeErrors say when memory runs out: the CPU allocator's "can't
# allocate memory", safetensors' "unable to mmap ...: Cannot allocate memory (12)", CUDA's
# "CUDA error: out of memory" (the caching allocator raises torch.OutOfMemoryError)
_OUT_OF_MEMORY = ("can't allocate memory", "cannot allocate memory", "out of memory")


def _allocation_failed(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(e).lower()
    return any(words in text for words in _OUT_OF_MEMORY)


def set_cpu_threads(n: int | None) -> int:
    """Set torch's intra-op threads; None: at most all cores but one (never raises it)."""
    if n is None:
        n = min(torch.get_num_threads(), max(1, (os.cpu_count() or 1) - 1))
    elif not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_THREADS:
        raise ConfigError(f"num_threads (--threads) must be an integer from 1 to {MAX_THREADS:,}, got {n!r}")
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


def resolve_device(device: str) -> torch.device:
    d = str(device).lower()
    if d.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' was asked for but torch sees no CUDA GPU")
        return torch.device(d)
    if d != "cpu":
        raise ConfigError(f"unknown device {device!r} (use cpu or cuda)")
    return torch.device("cpu")


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        # the three the model runs in, as their names (float64 is refused by name too)
        if dtype not in DTYPES.values():
            raise ConfigError(f"unsupported dtype {dtype} (use float32, bfloat16 or float16)")
        return dtype
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    return DTYPES[dtype.lower()]


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        model_dir=None,
        *,
        device="cpu",
        dtype=None,
        block_size=16,
        max_num_seqs=256,
        b_max=512,
        max_model_len=2048,
        kv_cache_gb=None,
        num_blocks=None,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        enforce_eager=False,
        seed=0,
        workspace_tokens=None,
    ):
        # checked whatever the device and whether or not --num-blocks sizes the cache: a bad
        # value is refused, not ignored because it happens not to be used on this machine
        u = as_real(gpu_memory_utilization)
        if u is None or not 0 < u <= 1:  # (nan fails this too)
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        gb = None if kv_cache_gb is None else as_real(kv_cache_gb)
        if kv_cache_gb is not None:
            check_kv_cache_gb(math.nan if gb is None else gb, "kv_cache_gb", repr(kv_cache_gb))
        kv_cache_gb, gpu_memory_utilization = gb, u
        if num_blocks is not None:
            n = as_int(num_blocks)  # (2.5 reached torch as a tensor size; True was 1 block)
            if n is None or n < 1:
                raise ConfigError(f"num_blocks must be a positive integer, got {num_blocks!r}")
            num_blocks = n
        s = as_int(seed)  # the range torch.manual_seed takes
        if s is None or not -(1 << 63) <= s <= MAX_SEED:
            # the flag too, as for max_model_len: serve passes --seed here unchecked
            raise ConfigError(f"seed (--seed) must be an integer from -2**63 to 2**64 - 1, got {seed!r}")
        seed = s
        self.cfg = cfg
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.cuda = self.device.type == "cuda"
        # what sized the cache, as the Python argument and the flag, for the messages that
        # ask for a different size: --num-blocks is only `serve`'s, --kv-cache-gb only CPU's
        if num_blocks is not None:
            self.kv_size_knob = ("num_blocks", "--num-blocks")
        elif self.cuda:
            self.kv_size_knob = ("gpu_memory_utilization", "--gpu-memory-utilization")
        else:
            self.kv_size_knob = ("kv_cache_gb", "--kv-cache-gb")
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.b_max = b_max
        self.max_model_len = max_model_len
        # largest decode gather (sequences x padded context tokens) in one SDPA call
        self.workspace_tokens = workspace_tokens or (1 << 21 if self.cuda else 1 << 18)
        self.windows = any(w is not None for w in cfg.sliding_windows)
        self.graphs = None  # decode CUDA graphs, made once the cache exists
        # CPU float32: decode attention reads the paged cache in place (cpu_kernel)
        self.decode_kernel = decode_kernel() if self.device.type == "cpu" and self.dtype == torch.float32 else None
        torch.manual_seed(seed)
        self.dtype_bytes = torch.empty((), dtype=self.dtype).element_size()
        # the weights' size against the memory, then (in _load_model) config.json's sizes
        # against the checkpoint: both before the model is allocated
        self._check_weights_fit()
        self.model = self._load_model(model_dir, seed)
        self.model.eval()
        self.block_bytes = cfg.kv_bytes_per_token(self.dtype_bytes) * block_size
        self._kv_budget: float | None = None  # bytes the KV cache may take (set when sizing it)
        if num_blocks is None:
            num_blocks = self._cuda_blocks(gpu_memory_utilization) if self.cuda else self._cpu_blocks(kv_cache_gb)
        if num_blocks < 1:
            budget = self._kv_budget
            if budget is not None and 0 < budget < self.block_bytes:
                # the memory is there, one block alone is larger than it
                # (on CUDA the cache gets what --gpu-memory-utilization leaves; --kv-cache-gb is CPU's)
                where = "--gpu-memory-utilization" if self.cuda else "--kv-cache-gb"
                raise ConfigError(
                    f"one KV-cache block of {block_size} tokens takes {_mib(self.block_bytes)}, more than "
                    f"the {_mib(budget)} the KV cache has; lower --block-size or raise {where}"
                )
            raise ConfigError(
                "no memory is left for the KV cache; lower max_num_seqs or b_max, "
                "or raise the memory given to the cache"
            )
        self.num_blocks = num_blocks
        if not self.cuda:
            self._check_cpu_cache_fits(num_blocks)
        self._allocate_cache(num_blocks)
        self.graphs = DecodeGraphs(self) if self.cuda and not enforce_eager else None

    def _load_model(self, model_dir, seed: int) -> CausalLM:
        """The model with its weights from `model_dir` (random without one). The memory
        check passed, yet the allocator may still refuse (memory in use elsewhere): that is
        one line naming the folder and the bytes, not the allocator's traceback."""
        try:
            # config.json's sizes against the checkpoint before the model is allocated (an
            # absurd size was an allocator traceback, or the process killed under
            # overcommit), from the files' headers and the config's arithmetic: a model,
            # even on the meta device, is built layer by layer (seconds for a config of
            # 20,000 layers over a checkpoint of 2)
            plan = None if model_dir is None else check_weights(self.cfg, model_dir)
            model = CausalLM(self.cfg, self.dtype, self.device)
            if model_dir is None:
                model.init_random(seed)
            else:
                load_weights(model, model_dir, plan)
        except (RuntimeError, MemoryError) as e:
            if not _allocation_failed(e):
                raise
            what = "the model's weights" if model_dir is None else f"the weights of model folder {model_dir}"
            need = self.cfg.num_params() * self.dtype_bytes
            size = f"{need:,} bytes" if need < 1 << 20 else f"{_gib(need)} ({need:,} bytes)"
            where = "GPU" if self.cuda else "CPU"
            smaller = ", or halve them with --dtype bfloat16" if self.dtype_bytes > 2 else ""
            raise ConfigError(
                f"cannot allocate {what}: they need {size} and the {where} ran out of memory loading them "
                f"(in use elsewhere?); free some memory{smaller}"
            ) from e
        return model

    def _check_weights_fit(self) -> None:
        cfg = self.cfg
        need = cfg.num_params() * self.dtype_bytes
        if self.cuda:
            have, where = torch.cuda.get_device_properties(self.device).total_memory, "the GPU has"
        else:
            have, where = physical_memory(), "the machine has"
        if have is not None and need > have:
            raise ConfigError(
                f"the model's weights ({_gib(need)}: {cfg.num_params():,} parameters of {self.dtype_bytes} bytes) "
                f"take more than the {_gib(have)} of memory {where}; check the sizes in the model's config"
            )

    # ---- KV cache sizing -----------------------------------------------------------------
    def _useful_blocks(self) -> int:
        """More blocks than every sequence at full length is of no use."""
        per_seq = -(-self.max_model_len // self.block_size)
        return self.max_num_seqs * (per_seq + 1)

    def _cpu_blocks(self, kv_cache_gb) -> int:
        if kv_cache_gb is None:
            kv_cache_gb = 1.0
        self._kv_budget = budget = int(kv_cache_gb * (1 << 30))
        return min(budget // self.block_bytes, self._useful_blocks())

    def _cache_too_large(self, num_blocks: int, why: str) -> ConfigError:
        size = (num_blocks + 1) * self.block_bytes  # (+1: the scratch block)
        where = "GPU" if self.cuda else "CPU"
        name, flag = self.kv_size_knob
        return ConfigError(
            f"the KV cache of {num_blocks:,} block{'' if num_blocks == 1 else 's'} of {self.block_size} tokens "
            f"({_gib(size)}) {why} on the {where}; "
            f"lower {flag} or --max-running ({name}, max_num_seqs)"
        )

    def _check_cpu_cache_fits(self, num_blocks: int) -> None:
        """A CPU cache larger than the machine's memory is refused before it is made: with
        overcommit, zeroing it could get the process killed instead of raising."""
        physical = physical_memory()
        if physical is not None and (num_blocks + 1) * self.block_bytes > physical:
            raise self._cache_too_large(num_blocks, f"is larger than the {_gib(physical)} of memory")

    def _cuda_blocks(self, utilization: float) -> int:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._allocate_cache(1)
        self._dummy_steps()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        self._free_cache()
        torch.cuda.empty_cache()
        budget = total * utilization - (total - free) - peak
        self._kv_budget = budget
        return max(0, min(int(budget // self.block_bytes), self._useful_blocks()))

    def _dummy_steps(self) -> None:
        """A full prefill step and a widest decode step against block 0 (memory profile, warm-up)."""
        n = max(1, min(self.b_max, self.max_model_len))
        blocks = self._tensor([0] * -(-n // self.block_size))
        self.forward_raw(
            [0] * n,
            list(range(n)),
            [0] * n,
            0,
            None,
            None,
            [PrefillChunk(0, n, 0, blocks)],
            sample_rows=min(n, self.max_num_seqs),
        )
        b = self.max_num_seqs
        blocks = max(1, min(-(-self.max_model_len // self.block_size), self.workspace_tokens // (b * self.block_size)))
        self.forward_raw([0] * b, [0] * b, [0] * b, b, [[0] * blocks] * b, [1] * b, [], sample_rows=b)

    def _allocate_cache(self, num_blocks: int) -> None:
        c = self.cfg
        shape = (c.num_layers, c.num_kv_heads, num_blocks + 1, self.block_size, c.head_dim)
        try:
            self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        except (RuntimeError, MemoryError) as e:  # (torch.cuda.OutOfMemoryError is a RuntimeError)
            self.k_cache = self.v_cache = None
            if not (_allocation_failed(e) or "overflow" in str(e).lower()):  # (torch: "size ... overflowed")
                raise  # a bug, not a cache too large: its own traceback
            raise self._cache_too_large(num_blocks, "could not be allocated") from e
        for i, layer in enumerate(self.model.layers):
            layer.k_cache, layer.v_cache = self.k_cache[i], self.v_cache[i]
        self.scratch_block = num_blocks  # owned by no sequence

    def _free_cache(self) -> None:
        for layer in self.model.layers:
            layer.k_cache = layer.v_cache = None
        self.k_cache = self.v_cache = None

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    # ---- one step ------------------------------------------------------------------------
    def _tensor(self, values, dtype=torch.long):
        t = torch.tensor(values, dtype=dtype)
        return t.to(self.device, non_blocking=True) if self.cuda else t

    @torch.inference_mode()
    def forward_raw(
        self,
        ids,
        positions,
        slots,
        n_decode,
        block_tables,
        context_lens,
        prefills,
        sample_rows=None,
        sample_index=None,
        skip_attention=False,
        extra_index=None,
        extra_out=None,
    ):
        """Forward pass of packed tokens; returns float32 logits of the sampled rows
        (`sample_index`, or the last `sample_rows` rows). `extra_index`: more rows whose
        final hidden states are appended to the list `extra_out` (prompt logprobs)."""
        graph_hidden = None
        if self.graphs is not None and not prefills and n_decode and not skip_attention:
            graph_hidden = self.graphs.run(ids, positions, slots, block_tables, context_lens)
        if graph_hidden is not None:
            hidden = graph_hidden
        else:
            bt = ctx = None
            groups = 1
            if n_decode:
                width = max(len(b) for b in block_tables)
                rows = [b + [self.scratch_block] * (width - len(b)) for b in block_tables]
                bt = self._tensor(rows)
                ctx = self._tensor(context_lens)
                if self.decode_kernel is None:  # the torch path gathers: bound the gathered tensor
                    groups = max(1, math.ceil(n_decode * width * self.block_size / self.workspace_tokens))
            meta = AttnMeta(
                self._tensor(slots),
                n_decode,
                bt,
                ctx,
                prefills,
                self.block_size,
                skip=skip_attention,
                decode_groups=groups,
                threads=torch.get_num_threads(),
                fused=self.decode_kernel,
            )
            hidden = self.model(self._tensor(ids), self._tensor(positions), meta)
        if extra_index:
            extra_out.append(hidden[self._tensor(extra_index)])
        if sample_index is None:
            n = hidden.shape[0] if sample_rows is None else sample_rows
            rows = hidden[hidden.shape[0] - n :]
        elif len(sample_index) == hidden.shape[0]:
            rows = hidden
        else:
            rows = hidden[self._tensor(sample_index)]
        return self.model.logits(rows)

    def execute(
        self,
        decoders: list,
        chunks: list,
        params: list,
        generators: list,
        skip_attention: bool = False,
        banned: list | None = None,
        history: list | None = None,
        logprobs_out: list | None = None,
        prompt_rows: list | None = None,
        prompt_out: list | None = None,
    ) -> list[int]:
        """decoders: sequences (`token_ids`, `blocks`) that each decode their last token;
        chunks: `(sequence, start, n, samples)` prefill chunks. Returns the sampled token
        of each decoder, then of each chunk that completes its prompt, in that order.
        `skip_attention` (profiling): run everything but attention. `banned`: per sampled
        row, token ids it may not draw; `history`, `logprobs_out`: see `sampler.sample`.
        `prompt_rows`: per chunk, None or `(lo, hi, k)`: positions lo..hi-1 of the chunk's
        sequence (inside the chunk) whose next-token logprobs are wanted with `k` top ones;
        `prompt_out` then gets, per chunk, None or the list of `(logprob of the token at
        p + 1, [(id, logprob)] top k)` for p in lo..hi-1. Only those rows pay for logits."""
        bs = self.block_size
        ids, pos, slots, tables, ctx = [], [], [], [], []
        for s in decoders:
            toks = s.token_ids
            p = len(toks) - 1
            ids.append(toks[p])
            pos.append(p)
            slots.append(s.blocks[p // bs] * bs + p % bs)
            tables.append(s.blocks)
            ctx.append(p + 1)
        t = len(decoders)
        sample_index = list(range(t))
        prefills = []
        extra: list[int] = []  # rows whose logits the prompt logprobs need
        extra_spans = []  # per chunk with prompt rows: (chunk index, sequence, lo, hi, k)
        for ci, (s, start, n, samples) in enumerate(chunks):
            pr = prompt_rows[ci] if prompt_rows is not None else None
            if pr is not None:
                lo, hi, k = pr
                extra.extend(range(t + lo - start, t + hi - start))
                extra_spans.append((ci, s, lo, hi, k))
            ids.extend(s.token_ids[start : start + n])
            pos.extend(range(start, start + n))
            blocks = s.blocks
            slots.extend([blocks[p // bs] * bs + p % bs for p in range(start, start + n)])
            need_cache = start > 0 or self.windows
            prefills.append(PrefillChunk(t, n, start, self._tensor(blocks) if need_cache else None))
            t += n
            if samples:
                sample_index.append(t - 1)
        hidden_out: list = []
        logits = self.forward_raw(
            ids,
            pos,
            slots,
            len(decoders),
            tables,
            ctx,
            prefills,
            sample_index=sample_index,
            skip_attention=skip_attention,
            extra_index=extra,
            extra_out=hidden_out,
        )
        if extra:
            self._prompt_logprobs(hidden_out[0], extra_spans, len(chunks), prompt_out)
        if not sample_index:
            self.synchronize()
            return []
        return sample(logits, params, generators, banned, history, logprobs_out)

    PROMPT_LOGITS_ROWS = 256  # rows of prompt-logprob logits computed at once (bounds memory)

    @torch.inference_mode()
    def _prompt_logprobs(self, hidden, spans, n_chunks: int, out: list) -> None:
        """Fill `out` (one entry per chunk) from the final hidden states of the prompt
        rows (`spans` in row order): per position p, the log-softmax of the logits gathered
        at the prompt token p + 1, and the top k."""
        res: list = [None] * n_chunks
        row = 0
        for ci, s, lo, hi, k in spans:
            toks = s.token_ids
            entries = []
            for a in range(lo, hi, self.PROMPT_LOGITS_ROWS):
                b = min(hi, a + self.PROMPT_LOGITS_ROWS)
                logits = self.model.logits(hidden[row + a - lo : row + b - lo])
                entries.extend(logprob_entries(logits, self._tensor(toks[a + 1 : b + 1]), [k] * (b - a)))
            row += hi - lo
            res[ci] = entries
        out.extend(res)

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


class DecodeGraphs:
    """CUDA graphs of decode-only steps, captured lazily per (padded batch size, padded
    block-table width) bucket. Padded rows decode into the scratch block."""

    def __init__(self, runner: ModelRunner):
        self.r = runner
        n = runner.max_num_seqs
        self.sizes = [s for s in (1, 2, 4, 8, *range(16, n, 16)) if s < n] + [n]
        self.max_blocks = -(-runner.max_model_len // runner.block_size)
        dev = runner.device
        self.ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.zeros(n, dtype=torch.long, device=dev)
        self.slots = torch.zeros(n, dtype=torch.long, device=dev)
        self.ctx = torch.ones(n, dtype=torch.long, device=dev)
        self.bt = torch.zeros(n, self.max_blocks, dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.pool = None
        self.disabled = False

    def bucket(self, n: int, width: int) -> tuple[int, int] | None:
        bsz = next((s for s in self.sizes if s >= n), None)
        blk = 4
        while blk < width:
            blk *= 2
        blk = min(blk, self.max_blocks)
        if bsz is None or blk < width or bsz * blk * self.r.block_size > self.r.workspace_tokens:
            return None
        return bsz, blk

    def run(self, ids, positions, slots, block_tables, context_lens):
        if self.disabled:
            return None
        n = len(ids)
        key = self.bucket(n, max(len(b) for b in block_tables))
        if key is None:
            return None
        bsz, blk = key
        r = self.r
        pad = bsz - n
        scratch = r.scratch_block
        self.ids[:bsz].copy_(r._tensor(list(ids) + [0] * pad))
        self.pos[:bsz].copy_(r._tensor(list(positions) + [0] * pad))
        self.slots[:bsz].copy_(r._tensor(list(slots) + [scratch * r.block_size] * pad))
        self.ctx[:bsz].copy_(r._tensor(list(context_lens) + [1] * pad))
        rows = [b + [scratch] * (blk - len(b)) for b in block_tables] + [[scratch] * blk] * pad
        self.bt[:bsz, :blk].copy_(r._tensor(rows))
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(bsz, blk)
            except Exception as e:  # noqa: BLE001 - any capture failure: stay eager
                log.warning("CUDA graph capture failed (%s); decode steps stay eager", e)
                self.disabled = True
                return None
            self.graphs[key] = entry
        graph, out = entry
        graph.replay()
        return out[:n]

    def _meta(self, bsz: int, blk: int) -> AttnMeta:
        return AttnMeta(self.slots[:bsz], bsz, self.bt[:bsz, :blk], self.ctx[:bsz], [], self.r.block_size)

    def _capture(self, bsz: int, blk: int):
        model = self.r.model
        stream = torch.cuda.Stream(device=self.r.device)
        stream.wait_stream(torch.cuda.current_stream(self.r.device))
        with torch.cuda.stream(stream):
            model(self.ids[:bsz], self.pos[:bsz], self._meta(bsz, blk))
        torch.cuda.current_stream(self.r.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = model(self.ids[:bsz], self.pos[:bsz], self._meta(bsz, blk))
        if self.pool is None:
            self.pool = graph.pool()
        return graph, out
