"""Decode attention that reads the paged KV cache in place, for float32 on the CPU.

The pure-torch decode path gathers every decoder's blocks into a fresh tensor once per
layer (`k_cache[:, block_table]`) before SDPA reads them: on the CPU that copy cost more
than the attention itself. This module compiles a small C function (no torch headers, so
it builds in well under a second) that walks each decoder's block table and reads its K/V
rows where they lie, only the positions inside its context (and sliding window): values
left in a block by an earlier owner are never read. It is called through `ctypes` with
the tensors' data pointers; `ctypes` releases the GIL during the call.

The shared library is built once per source, compiler flags and CPU, and cached under
`$LLMSCHED_CACHE_DIR` (default `$XDG_CACHE_HOME/llmsched` or `~/.cache/llmsched`).
Without a C compiler, or with `LLMSCHED_CPU_ATTENTION=torch`, the engine keeps the
pure-torch path (one warning); `LLMSCHED_CPU_ATTENTION=c` makes a build failure an error.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..core.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "LLMSCHED_CPU_ATTENTION"

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>

typedef struct {
    const float *q, *kc, *vc;
    const int64_t *bt, *lens;
    float *out;
    int64_t H, KVH, D, NB, BS, W, window, start, end;
    float scale;
    int status;
} job_t;

static inline void prefetch_block(const float *p, int64_t n) {
    for (int64_t c = 0; c < n; c += 16) __builtin_prefetch(p + c);
}

/* exp(x) for x <= 0 (a softmax after subtracting the max), vectorizable: 2^n * p(r) with
   Cephes' single-precision polynomial (about 1 ulp); NaN stays NaN, x < -87 gives 0. */
static inline float exp_neg(float x) {
    const float xc = x < -87.0f ? -87.0f : x;
    const float n = __builtin_floorf(xc * 1.44269504088896341f + 0.5f);
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } e;
    e.i = ((int32_t)n + 127) << 23;
    return x < -87.0f ? 0.0f : p * e.f;
}

/* One (decoder b, kv head h) pair: its G query heads against K/V rows lo..len-1, read in
   place block by block. s: [maxc] scores. D is a compile-time constant where the
   caller's switch inlines this, so the row loops unroll and `a` stays in registers. */
static inline __attribute__((always_inline)) void pair(const job_t *j, int64_t b, int64_t h, const int64_t D,
                                                       float *s) {
    const int64_t G = j->H / j->KVH, BS = j->BS, maxc = j->W * BS, bsd = BS * D;
    int64_t len = j->lens[b];
    if (len > maxc) len = maxc;
    const int64_t lo = (j->window > 0 && len > j->window) ? len - j->window : 0, n = len - lo;
    const int64_t *row = j->bt + b * j->W;
    const float *kh = j->kc + h * j->NB * bsd, *vh = j->vc + h * j->NB * bsd;
    const int64_t b0 = lo / BS, b1 = (len + BS - 1) / BS;
    const float scale = j->scale;
    for (int64_t g = 0; g < G; g++) {
        const float *qg = j->q + (b * j->H + h * G + g) * D;
        float *o = j->out + (b * j->H + h * G + g) * D;
        for (int64_t blk = b0; blk < b1; blk++) {
            if (g == 0) {
                if (blk + 1 < b1) prefetch_block(kh + row[blk + 1] * bsd, bsd);
                prefetch_block(vh + row[blk] * bsd, bsd);
            }
            const int64_t base = blk * BS;
            const int64_t t0 = lo > base ? lo - base : 0, t1 = len - base < BS ? len - base : BS;
            const float *kb = kh + row[blk] * bsd;
            for (int64_t t = t0; t < t1; t++) {
                const float *k = kb + t * D;
                float x = 0.0f;
#pragma omp simd reduction(+:x)
                for (int64_t i = 0; i < D; i++) x += qg[i] * k[i];
                s[base + t - lo] = x * scale;
            }
        }
        float m = -INFINITY;
#pragma omp simd reduction(max:m)
        for (int64_t i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
        float tot = 0.0f;
#pragma omp simd reduction(+:tot)
        for (int64_t i = 0; i < n; i++) {
            s[i] = exp_neg(s[i] - m);
            tot += s[i];
        }
        float a[D];
        for (int64_t i = 0; i < D; i++) a[i] = 0.0f;
        for (int64_t blk = b0; blk < b1; blk++) {
            const int64_t base = blk * BS;
            const int64_t t0 = lo > base ? lo - base : 0, t1 = len - base < BS ? len - base : BS;
            const float *vb = vh + row[blk] * bsd;
            for (int64_t t = t0; t < t1; t++) {
                const float e = s[base + t - lo], *v = vb + t * D;
#pragma omp simd
                for (int64_t i = 0; i < D; i++) a[i] += e * v[i];
            }
        }
        const float r = 1.0f / tot;
#pragma omp simd
        for (int64_t i = 0; i < D; i++) o[i] = a[i] * r;
    }
}

static void *run(void *arg) {
    job_t *j = (job_t *)arg;
    const int64_t D = j->D;
    float *s = (float *)malloc(sizeof(float) * (size_t)(j->W * j->BS));
    if (!s) { j->status = 1; return NULL; }
    for (int64_t w = j->start; w < j->end; w++) {
        const int64_t b = w / j->KVH, h = w % j->KVH;
        switch (D) {  /* constant head sizes let the compiler unroll the row loops */
            case 32: pair(j, b, h, 32, s); break;
            case 64: pair(j, b, h, 64, s); break;
            case 128: pair(j, b, h, 128, s); break;
            default: pair(j, b, h, D, s);
        }
    }
    free(s);
    return NULL;
}

/* q, out: [B, H, D] (row b of q at b * H * D); kc, vc: [KVH, NB, BS, D]; bt: [B, W];
   lens: [B]. Work items (decoder, kv head) are split over `threads` threads. 0: done. */
int paged_decode(const float *q, const float *kc, const float *vc, const int64_t *bt,
                 const int64_t *lens, float *out, int64_t B, int64_t H, int64_t KVH, int64_t D,
                 int64_t NB, int64_t BS, int64_t W, float scale, int64_t window, int64_t threads) {
    const int64_t items = B * KVH;
    if (threads > items) threads = items;
    if (threads > 64) threads = 64;
    if (threads < 1) threads = 1;
    job_t jobs[64];
    pthread_t tids[64];
    int started[64] = {0};
    for (int64_t t = 0; t < threads; t++) {
        job_t j = {q, kc, vc, bt, lens, out, H, KVH, D, NB, BS, W, window,
                   items * t / threads, items * (t + 1) / threads, scale, 0};
        jobs[t] = j;
    }
    for (int64_t t = 1; t < threads; t++) started[t] = pthread_create(&tids[t], NULL, run, &jobs[t]) == 0;
    run(&jobs[0]);
    int status = jobs[0].status;
    for (int64_t t = 1; t < threads; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else run(&jobs[t]);
        status |= jobs[t].status;
    }
    return status;
}
"""

_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno"]
_lib = None
_tried = False


def _cache_dir() -> Path:
    d = os.environ.get("LLMSCHED_CACHE_DIR")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmsched"


def _cpu_fingerprint() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features", "model name")):
                    return line
    except OSError:
        pass
    import platform  # noqa: PLC0415

    return platform.machine() + platform.processor()


def _build(cc: str, flags: list[str], target: Path) -> bool:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "paged_decode.c"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        p = subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm", "-lpthread"], capture_output=True, timeout=120)
        if p.returncode != 0 or not out.is_file():
            log.debug("building the CPU attention kernel failed: %s", p.stderr.decode(errors="replace")[-500:])
            return False
        os.replace(out, target)  # atomic: concurrent builders each write a whole file
    return True


def _load():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise OSError("no C compiler found (cc, gcc or clang)")
    for flags in (_FLAGS + ["-march=native"], _FLAGS):
        key = hashlib.sha256("\0".join([SOURCE, cc, *flags, _cpu_fingerprint()]).encode()).hexdigest()[:16]
        target = _cache_dir() / "kernels" / f"paged_decode-{key}.so"
        if target.is_file() or _build(cc, flags, target):
            lib = ctypes.CDLL(str(target))
            fn = lib.paged_decode
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_float] + [ctypes.c_int64] * 2
            return fn
    raise OSError(f"{cc} could not build it")


def decode_kernel():
    """The compiled `paged_decode` function, or None (pure-torch attention). Built or
    loaded once per process."""
    global _lib, _tried
    mode = os.environ.get(ENV, "auto").lower()
    if mode not in ("auto", "c", "torch"):
        raise ConfigError(f"{ENV} must be auto, c or torch, got {mode!r}")
    if mode == "torch":
        return None
    if not _tried:
        _tried = True
        try:
            _lib = _load()
        except (OSError, subprocess.SubprocessError) as e:
            if mode == "c":
                raise ConfigError(f"{ENV}=c but the CPU attention kernel cannot be built: {e}") from None
            log.warning("CPU attention kernel unavailable (%s); using pure-torch attention", e)
    if _lib is None and mode == "c":
        raise ConfigError(f"{ENV}=c but the CPU attention kernel could not be built")
    return _lib


def run_decode(fn, q, k_cache, v_cache, block_tables, context_lens, out, scale: float, window, threads: int) -> None:
    """Decode attention of the first B rows of `q` [T, H, D] into the first B rows of
    `out` (both contiguous float32); B = rows of `block_tables` [B, W] (int64)."""
    kvh, nb, bs, d = k_cache.shape
    b, h = block_tables.shape[0], q.shape[1]
    rc = fn(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        context_lens.data_ptr(),
        out.data_ptr(),
        b,
        h,
        kvh,
        d,
        nb,
        bs,
        block_tables.shape[1],
        scale,
        window or 0,
        threads,
    )
    if rc:
        raise MemoryError("the CPU attention kernel could not allocate its workspace")
