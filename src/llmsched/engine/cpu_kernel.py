"""Compiled CPU kernels for float32: decode attention that reads the paged KV cache in
place, and the fused element-wise ops around the matmuls (RMSNorm with the residual add,
rotary embedding in place, SiLU-and-multiply).

The pure-torch decode path gathers every decoder's blocks into a fresh tensor once per
layer (`k_cache[:, block_table]`) before SDPA reads them: on the CPU that copy cost more
than the attention itself. This module compiles a small C function (no torch headers, so
it builds in well under a second) that walks each decoder's block table and reads its K/V
rows where they lie, only the positions inside its context (and sliding window): values
left in a block by an earlier owner are never read. It is called through `ctypes` with
the tensors' data pointers; `ctypes` releases the GIL during the call. The element-wise
kernels replace 5-8 small torch ops each: on a decode step of a small model the per-op
overhead of those ops cost about as much as the attention.

The shared library is built once per source, compiler flags and CPU, and cached under
`$LLMSCHED_CACHE_DIR/kernels` (the variable's default: `$XDG_CACHE_HOME/llmsched` or
`~/.cache/llmsched`).
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

import torch

from ..core.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "LLMSCHED_CPU_ATTENTION"

SOURCE = r"""
#define PF 1 /* prefetch distance, in blocks */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f load8(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline v8f splat(float x) { return (v8f){x, x, x, x, x, x, x, x}; }
static inline v8f vsel(v8i m, v8f a, v8f b) { return (v8f)((m & (v8i)a) | (~m & (v8i)b)); }

/* exp of 8 floats: 2^n * p(r), Cephes' single-precision polynomial (about 1 ulp); inputs
   below -87 give 0, above 87 are clamped to 87; NaN stays NaN */
static inline v8f exp8(v8f x) {
    const v8i lo = x < splat(-87.0f), hi = x > splat(87.0f);
    const v8f xc = vsel(lo, splat(-87.0f), vsel(hi, splat(87.0f), x));
    const v8f n = (xc * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f);
    const v8f r = (xc - n * splat(0.693359375f)) + n * splat(2.12194440e-4f);
    v8f p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    return vsel(lo, splat(0.0f), p * (v8f)e);
}

typedef struct {
    const float *q, *kc, *vc;
    int64_t qs; /* row stride of q in floats */
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
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float e;
    memcpy(&e, &bits, sizeof e);
    return x < -87.0f ? 0.0f : p * e;
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
    for (int64_t p = b0; p < b0 + PF && p < b1; p++) prefetch_block(kh + row[p] * bsd, bsd);
    for (int64_t p = b0; p < b0 + PF - 1 && p < b1; p++) prefetch_block(vh + row[p] * bsd, bsd);
    /* scores of all G query heads, row by row: each K row is loaded once */
    for (int64_t blk = b0; blk < b1; blk++) {
        if (blk + PF < b1) prefetch_block(kh + row[blk + PF] * bsd, bsd);
        if (blk + PF - 1 < b1) prefetch_block(vh + row[blk + PF - 1] * bsd, bsd);
        const int64_t base = blk * BS;
        const int64_t t0 = lo > base ? lo - base : 0, t1 = len - base < BS ? len - base : BS;
        const float *kb = kh + row[blk] * bsd;
        for (int64_t t = t0; t < t1; t++) {
            const float *k = kb + t * D;
            for (int64_t g = 0; g < G; g++) {
                const float *qg = j->q + b * j->qs + (h * G + g) * D;
                float x = 0.0f;
#pragma omp simd reduction(+:x)
                for (int64_t i = 0; i < D; i++) x += qg[i] * k[i];
                s[g * maxc + base + t - lo] = x * scale;
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *o = j->out + (b * j->H + h * G + g) * D;
        float *sg = s + g * maxc;
        float m = -INFINITY;
#pragma omp simd reduction(max:m)
        for (int64_t i = 0; i < n; i++) m = sg[i] > m ? sg[i] : m;
        float tot = 0.0f;
        int64_t i0 = 0;
        v8f acc8 = splat(0.0f);
        for (; i0 + 8 <= n; i0 += 8) {
            const v8f e8 = exp8(load8(sg + i0) - splat(m));
            store8(sg + i0, e8);
            acc8 += e8;
        }
        for (int64_t i = i0; i < n; i++) {
            sg[i] = exp_neg(sg[i] - m);
            tot += sg[i];
        }
        tot += ((acc8[0] + acc8[4]) + (acc8[1] + acc8[5])) + ((acc8[2] + acc8[6]) + (acc8[3] + acc8[7]));
        float a[D];
        for (int64_t i = 0; i < D; i++) a[i] = 0.0f;
        for (int64_t blk = b0; blk < b1; blk++) {
            const int64_t base = blk * BS;
            const int64_t t0 = lo > base ? lo - base : 0, t1 = len - base < BS ? len - base : BS;
            const float *vb = vh + row[blk] * bsd;
            for (int64_t t = t0; t < t1; t++) {
                const float e = sg[base + t - lo], *v = vb + t * D;
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
    float *s = (float *)malloc(sizeof(float) * (size_t)(j->W * j->BS * (j->H / j->KVH)));
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

/* q: [B, H, D] rows qs floats apart; out: [B, H, D] contiguous; kc, vc: [KVH, NB, BS, D]; bt: [B, W];
   lens: [B]. Work items (decoder, kv head) are split over `threads` threads. 0: done. */
int paged_decode(const float *q, int64_t qs, const float *kc, const float *vc, const int64_t *bt,
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
        job_t j = {q, kc, vc, qs, bt, lens, out, H, KVH, D, NB, BS, W, window,
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

/* HF's RMSNorm in float32: h = x (+ res, written to res_out); out = w * (h / sqrt(mean(h^2) + eps)) */
void rms_norm(const float *x, const float *res, float *res_out, const float *w, float *out,
              int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n, *h = res_out ? res_out + r * n : NULL;
        float ss = 0.0f;
        if (res) {
            const float *rr = res + r * n;
#pragma omp simd reduction(+:ss)
            for (int64_t i = 0; i < n; i++) { const float v = xr[i] + rr[i]; h[i] = v; ss += v * v; }
            xr = h;
        } else {
#pragma omp simd reduction(+:ss)
            for (int64_t i = 0; i < n; i++) ss += xr[i] * xr[i];
        }
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* rotate-half rotary embedding in place on `heads` heads of each of T rows (rows `stride`
   floats apart); cos, sin: [T, D] (both halves equal, as HF builds them) */
void rotary(float *x, int64_t T, int64_t heads, int64_t D, int64_t stride, const float *cos_,
            const float *sin_) {
    const int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_ + t * D, *s = sin_ + t * D;
        for (int64_t hd = 0; hd < heads; hd++) {
            float *a = x + t * stride + hd * D, *b = a + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float x1 = a[i], x2 = b[i];
                const float y1 = x1 * c[i] + (-x2) * s[i];
                const float y2 = x2 * c[i + half] + x1 * s[i + half];
                a[i] = y1;
                b[i] = y2;
            }
        }
    }
}

/* out[t, i] = silu(gu[t, i]) * gu[t, I + i], silu(x) = x / (1 + exp(-x)) as torch computes it */
void silu_mul(const float *gu, float *out, int64_t T, int64_t I) {
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            const v8f x = load8(g + i);
            store8(o + i, (x / (splat(1.0f) + exp8(-x))) * load8(u + i));
        }
        for (; i < I; i++) {
            const float x = g[i];
            o[i] = (x / (1.0f + expf(-x))) * u[i];
        }
    }
}
"""

_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", "-Wno-psabi"]
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
        src = Path(tmp) / "cpu_kernels.c"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        p = subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm", "-lpthread"], capture_output=True, timeout=120)
        if p.returncode != 0 or not out.is_file():
            log.debug("building the CPU attention kernel failed: %s", p.stderr.decode(errors="replace")[-500:])
            return False
        os.replace(out, target)  # atomic: concurrent builders each write a whole file
    return True


class Kernels:
    """The compiled functions, called with tensors (float32, CPU; checked by the caller)."""

    def __init__(self, lib):
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        self.paged_decode = lib.paged_decode
        self.paged_decode.restype = ctypes.c_int
        self.paged_decode.argtypes = [ptr, i64, ptr, ptr, ptr, ptr, ptr] + [i64] * 7 + [f32, i64, i64]
        self._rms = lib.rms_norm
        self._rms.restype = None
        self._rms.argtypes = [ptr] * 5 + [i64, i64, f32]
        self._rot = lib.rotary
        self._rot.restype = None
        self._rot.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr]
        self._silu = lib.silu_mul
        self._silu.restype = None
        self._silu.argtypes = [ptr, ptr, i64, i64]

    def rms_norm(self, x, residual, weight, eps: float):
        """HF RMSNorm of x (+ residual: then also returns x + residual, written into x)."""
        rows, n = x.shape
        out = torch.empty_like(x)
        if residual is None:
            self._rms(x.data_ptr(), None, None, weight.data_ptr(), out.data_ptr(), rows, n, eps)
            return out
        self._rms(x.data_ptr(), residual.data_ptr(), x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, eps)
        return out, x

    def rotary(self, x, heads: int, head_dim: int, cos, sin) -> None:
        """In place on the first `heads` heads of every row of the 2-D `x`; cos, sin: [T, D]."""
        self._rot(x.data_ptr(), x.shape[0], heads, head_dim, x.stride(0), cos.data_ptr(), sin.data_ptr())

    def silu_mul(self, gate_up):
        t, i2 = gate_up.shape
        out = gate_up.new_empty((t, i2 // 2))
        self._silu(gate_up.data_ptr(), out.data_ptr(), t, i2 // 2)
        return out


def _load() -> Kernels:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise OSError("no C compiler found (cc, gcc or clang)")
    for flags in (_FLAGS + ["-march=native"], _FLAGS):
        key = hashlib.sha256("\0".join([SOURCE, cc, *flags, _cpu_fingerprint()]).encode()).hexdigest()[:16]
        target = _cache_dir() / "kernels" / f"cpu_kernels-{key}.so"
        if target.is_file() or _build(cc, flags, target):
            return Kernels(ctypes.CDLL(str(target)))
    raise OSError(f"{cc} could not build it")


def decode_kernel() -> Kernels | None:
    """The compiled kernels, or None (pure-torch attention and element-wise ops). Built or
    loaded once per process; `LLMSCHED_CPU_ATTENTION` (auto, c, torch) decides."""
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
                raise ConfigError(f"{ENV}=c but the CPU kernels cannot be built: {e}") from None
            log.warning("CPU kernels unavailable (%s); using pure-torch attention", e)
    if _lib is None and mode == "c":
        raise ConfigError(f"{ENV}=c but the CPU kernels could not be built")
    return _lib


def run_decode(kern: Kernels, q, k_cache, v_cache, block_tables, context_lens, out, scale: float, window, threads):
    """Decode attention of the first B rows of `q` [T, H, D] (rows may be strided, heads
    and head_dim contiguous) into the first B rows of `out` (contiguous); B = rows of
    `block_tables` [B, W] (int64); caches [KVH, blocks, block_size, D] contiguous."""
    kvh, nb, bs, d = k_cache.shape
    b, h = block_tables.shape[0], q.shape[1]
    rc = kern.paged_decode(
        q.data_ptr(),
        q.stride(0),
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
