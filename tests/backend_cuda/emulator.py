"""Runs the cuda backend's kernels on the host CPU, for testing code generation without a GPU.

The NVPTX module glue generates is retargeted to the host (address spaces dropped, kernels made
plain functions) and JIT-compiled with llvmlite; the few NVVM intrinsics it calls become C
functions: thread and block indices read thread-local variables, `barrier0` is a pthread
barrier over the block, and a warp shuffle publishes every thread's value and reads its
partner's between two barriers (glue only shuffles where the whole block does). Each block runs
as `block` POSIX threads, blocks one after another, so shared-memory globals are per block.
A kernel compiled for clusters runs a cluster's blocks at once, each from its own copy of the
module (its own shared memory): `barrier.cluster` is a pthread barrier over the cluster's
threads, `mapa` moves an address to the same place in another block's copy, and an mbarrier
counts the bytes `st.async` writes there (its state kept in a table keyed by its address).
Needs a C compiler (`cc`); tests skip without one.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from functools import lru_cache
from typing import Any, Sequence

import llvmlite.binding as llvm
import numpy as np

from glue.backend_cuda.codegen import CudaProgram
from glue.backend_cuda.steps import Planner, chosen_launches, plan_program, resolve_ref
from glue.scheduler.calls import run_call

_RUNTIME = r"""
#include <math.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

static __thread int32_t tid, ctaid, rank;     /* rank: the block's in its cluster */
static int32_t ntid, nctaid;
static pthread_barrier_t block_barriers[16], cluster_barrier;
static __thread pthread_barrier_t *barrier;      /* the block's */
static int64_t *all_slots;
static __thread int64_t *slots;                  /* the block's: one a thread */

int32_t emu_tid(void) { return tid; }
int32_t emu_ctaid(void) { return ctaid; }
int32_t emu_ntid(void) { return ntid; }
int32_t emu_nctaid(void) { return nctaid; }
void emu_barrier(void) { pthread_barrier_wait(barrier); }
void emu_cluster_barrier(void) { pthread_barrier_wait(&cluster_barrier); }
int32_t emu_shfl(int32_t mask, int32_t value, int32_t lane_mask, int32_t clamp) {
    slots[tid] = value;
    pthread_barrier_wait(barrier);
    int32_t other = (tid & ~31) | ((tid & 31) ^ lane_mask);
    int32_t result = other < ntid ? (int32_t)slots[other] : value;
    pthread_barrier_wait(barrier);
    return result;
}

uint32_t emu_bf16x2(float high, float low) {  /* round to nearest even, NaN stays NaN */
    uint32_t out = 0;
    float v[2] = {low, high};
    for (int i = 0; i < 2; i++) {
        uint32_t bits; memcpy(&bits, &v[i], 4);
        uint32_t r = v[i] != v[i] ? (bits | 0x400000) >> 16 : (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
        out |= (r & 0xFFFF) << (16 * i);
    }
    return out;
}
float emu_ex2(float x) { return exp2f(x); }
float emu_lg2(float x) { return log2f(x); }
float emu_sqrt(float x) { return sqrtf(x); }
float emu_rsqrt(float x) { return 1.0f / sqrtf(x); }
float emu_rcp(float x) { return 1.0f / x; }
/* the flush-to-zero forms: the host keeps subnormals, which only makes them more exact */
float emu_ex2_ftz(float x) { return exp2f(x); }
float emu_lg2_ftz(float x) { return log2f(x); }
float emu_sqrt_ftz(float x) { return sqrtf(x); }
float emu_rsqrt_ftz(float x) { return 1.0f / sqrtf(x); }

/* Warp-collective tensor-core operations: every lane publishes its operands, the block meets
   at a barrier (glue issues them where the whole block does), each lane computes its own part
   from its warp's lanes, and a second barrier frees the slots. */
static uint32_t *all_frags;
static __thread uint32_t *frags;  /* the block's: 6 words per thread, a0..a3, b0, b1 */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) bits = sign | 0x7F800000 | (man << 13);
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else { float v = (float)man / 16777216.0f; memcpy(&bits, &v, 4); bits |= sign; }
    float out; memcpy(&out, &bits, 4); return out;
}

static float sixteen(uint16_t v, int kind) {  /* kind 0: bfloat16, 1: float16 */
    if (kind) return half_to_float(v);
    uint32_t bits = (uint32_t)v << 16; float out; memcpy(&out, &bits, 4); return out;
}

/* Shared-memory wavefronts ldmatrix spent beyond one a matrix: its eight 16-byte rows, read
   at once, conflict where two fall in the same four banks (address bits 4-6). */
static int64_t ldmatrix_conflicts;
int64_t emu_ldmatrix_conflicts(void) { int64_t n = ldmatrix_conflicts; ldmatrix_conflicts = 0; return n; }

static void count_conflicts(const int64_t *rows) {
    for (int j = 0; j < 4; j++) {
        int32_t hits[8] = {0}, worst = 0;
        for (int r = 0; r < 8; r++) {
            int32_t banks = (int32_t)((rows[j * 8 + r] >> 4) & 7);
            if (++hits[banks] > worst) worst = hits[banks];
        }
        __atomic_fetch_add(&ldmatrix_conflicts, worst - 1, __ATOMIC_RELAXED);
    }
}

void emu_ldmatrix(const uint16_t *address, int32_t trans, uint32_t *out) {
    slots[tid] = (int64_t)(intptr_t)address;
    pthread_barrier_wait(barrier);
    int32_t warp = tid & ~31, lane = tid & 31, row = lane / 4, col = (lane % 4) * 2;
    if (lane == 0) count_conflicts(slots + warp);
    for (int j = 0; j < 4; j++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++)
            e[h] = trans ? ((const uint16_t *)(intptr_t)slots[warp + j * 8 + col + h])[row]
                         : ((const uint16_t *)(intptr_t)slots[warp + j * 8 + row])[col + h];
        out[j] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
    }
    pthread_barrier_wait(barrier);
}

/* kind 0: bfloat16, 1: float16 (m16n8k16, two per word), 2: TF32 (m16n8k8, one per word).
   A (m, k) is in word (m / 8) + 2 (k / g) of lane 4 (m % 8) + (k % g) / per, B (k, n) in word
   4 + k / g of lane 4 n + (k % g) / per, with g = 4 per: the PTX ISA's fragment layouts. */
void emu_mma(int32_t kind, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
             float c0, float c1, float c2, float c3, float *out) {
    uint32_t *mine = frags + 6 * tid;
    mine[0] = a0; mine[1] = a1; mine[2] = a2; mine[3] = a3; mine[4] = b0; mine[5] = b1;
    pthread_barrier_wait(barrier);
    int32_t warp = tid & ~31, lane = tid & 31, group = lane / 4, pair = (lane % 4) * 2;
    int32_t per = kind == 2 ? 1 : 2, g = 4 * per;
    float c[4] = {c0, c1, c2, c3};
    for (int r = 0; r < 4; r++) {
        int32_t m = group + 8 * (r / 2), n = pair + r % 2;
        float sum = c[r];
        for (int k = 0; k < 2 * g; k++) {
            uint32_t wa = frags[6 * (warp + (m % 8) * 4 + (k % g) / per) + (m / 8) + 2 * (k / g)];
            uint32_t wb = frags[6 * (warp + n * 4 + (k % g) / per) + 4 + k / g];
            float fa, fb;
            if (per == 1) {  /* TF32: the tensor cores read a word's top 19 bits */
                wa &= 0xFFFFE000; wb &= 0xFFFFE000;
                memcpy(&fa, &wa, 4); memcpy(&fb, &wb, 4);
            }
            else {
                fa = sixteen((uint16_t)(wa >> (16 * (k % 2))), kind);
                fb = sixteen((uint16_t)(wb >> (16 * (k % 2))), kind);
            }
            sum += fa * fb;
        }
        out[r] = sum;
    }
    pthread_barrier_wait(barrier);
}

uint32_t emu_f2tf32(float x) {  /* to nearest, ties away from zero, at 10 mantissa bits */
    uint32_t bits; memcpy(&bits, &x, 4);
    if ((bits & 0x7F800000) == 0x7F800000) return bits & 0xFFFFE000 | ((bits & 0x1FFF) ? 0x400000 : 0);
    return (bits + 0x1000) & 0xFFFFE000;
}

/* cp.async as a plain copy (a thread's copies are done before anything reads them here) */
static void copy_async(void *target, const void *source, int32_t nbytes, int32_t size) {
    memcpy(target, source, nbytes);
    memset((char *)target + nbytes, 0, size - nbytes);
}
void emu_cp_async(void *target, const void *source, int32_t nbytes) { copy_async(target, source, nbytes, 16); }
void emu_cp_async_4(void *target, const void *source, int32_t nbytes) { copy_async(target, source, nbytes, 4); }
void emu_cp_async_8(void *target, const void *source, int32_t nbytes) { copy_async(target, source, nbytes, 8); }
void emu_cp_async_commit(void) {}
void emu_cp_async_wait(int32_t n) { (void)n; }

/* mbarriers that count bytes other blocks send (st.async): kept beside the 8 shared bytes
   they live in, keyed by that address, under one lock; the table empties after each launch. */
typedef struct { void *at; int32_t arrivals, pending, phase; int64_t bytes; } mbarrier;
static mbarrier mbarriers[64];
static pthread_mutex_t mbarrier_lock = PTHREAD_MUTEX_INITIALIZER;

static mbarrier *mbarrier_at(void *at) {  /* with the lock held */
    for (int i = 0; i < 64; i++) if (mbarriers[i].at == at) return &mbarriers[i];
    for (int i = 0; i < 64; i++) if (!mbarriers[i].at) { mbarriers[i].at = at; return &mbarriers[i]; }
    abort();
}

static void mbarrier_step(mbarrier *m) {  /* the phase completes: no arrivals or bytes pending */
    if (m->pending == 0 && m->bytes == 0) { m->phase ^= 1; m->pending = m->arrivals; }
}

void emu_mbarrier_init(void *at, int32_t arrivals) {
    pthread_mutex_lock(&mbarrier_lock);
    mbarrier *m = mbarrier_at(at);
    *m = (mbarrier){at, arrivals, arrivals, 0, 0};
    pthread_mutex_unlock(&mbarrier_lock);
}

void emu_expect_bytes(void *at, int32_t nbytes) {
    pthread_mutex_lock(&mbarrier_lock);
    mbarrier *m = mbarrier_at(at);
    m->bytes += nbytes; m->pending -= 1; mbarrier_step(m);
    pthread_mutex_unlock(&mbarrier_lock);
}

int32_t emu_phase_done(void *at, int32_t parity) {
    pthread_mutex_lock(&mbarrier_lock);
    int32_t done = mbarrier_at(at)->phase != parity;
    pthread_mutex_unlock(&mbarrier_lock);
    if (!done) sched_yield();
    return done;
}

static void send(void *target, const void *value, int32_t nbytes, void *at) {
    pthread_mutex_lock(&mbarrier_lock);
    memcpy(target, value, nbytes);
    mbarrier *m = mbarrier_at(at);
    m->bytes -= nbytes; mbarrier_step(m);
    pthread_mutex_unlock(&mbarrier_lock);
}
void emu_send32(void *target, uint32_t value, void *at) { send(target, &value, 4, at); }
void emu_send64(void *target, uint64_t value, void *at) { send(target, &value, 8, at); }

/* The shared-memory globals of each rank's copy of a cluster kernel's module, for `mapa`. */
static int32_t shared_count;
static int64_t *shared_bases, *shared_sizes;  /* bases: [rank][global], sizes: [global] */

void emu_set_shared(int32_t count, int64_t *bases, int64_t *sizes) {
    shared_count = count; shared_bases = bases; shared_sizes = sizes;
}

void *emu_mapa(void *address, int32_t target) {
    int64_t p = (int64_t)(intptr_t)address;
    for (int32_t g = 0; g < shared_count; g++) {
        int64_t base = shared_bases[rank * shared_count + g];
        if (p >= base && p < base + shared_sizes[g])
            return (void *)(intptr_t)(shared_bases[target * shared_count + g] + (p - base));
    }
    abort();  /* not an address in this block's shared memory */
}

typedef struct { void *fn; int nparams; void **params; int32_t block; int32_t thread; int32_t rank; } job;

static void *run(void *arg) {
    job *j = (job *)arg;
    tid = j->thread; ctaid = j->block; rank = j->rank;
    barrier = &block_barriers[rank];
    slots = all_slots + (int64_t)rank * ntid;
    frags = all_frags + (int64_t)rank * ntid * 6;
    void **p = j->params;
    switch (j->nparams) {
#define CALL(n, ...) case n: ((void (*)())j->fn)(__VA_ARGS__); break;
    CALL(0)
    CALL(1, p[0]) CALL(2, p[0], p[1]) CALL(3, p[0], p[1], p[2]) CALL(4, p[0], p[1], p[2], p[3])
    CALL(5, p[0], p[1], p[2], p[3], p[4]) CALL(6, p[0], p[1], p[2], p[3], p[4], p[5])
    CALL(7, p[0], p[1], p[2], p[3], p[4], p[5], p[6])
    CALL(8, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
    CALL(9, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8])
    CALL(10, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9])
    CALL(11, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10])
    CALL(12, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11])
    CALL(13, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12])
    CALL(14, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13])
    CALL(15, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14])
    CALL(16, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15])
    CALL(17, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16])
    CALL(18, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17])
    CALL(19, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18])
    CALL(20, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19])
    CALL(21, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20])
    CALL(22, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21])
    CALL(23, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22])
    CALL(24, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23])
    CALL(25, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24])
    CALL(26, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25])
    CALL(27, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26])
    CALL(28, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27])
    CALL(29, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28])
    CALL(30, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28], p[29])
    CALL(31, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28], p[29], p[30])
    CALL(32, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21], p[22], p[23], p[24], p[25], p[26], p[27], p[28], p[29], p[30], p[31])
    default: abort();
    }
    return 0;
}

/* `fns[r]`: the kernel in rank r's copy of its module; `cluster` blocks run at once. */
int emu_launch(void **fns, int nparams, void **params, int32_t grid, int32_t block, int32_t cluster) {
    if (cluster > 16) return -1;
    int32_t threads_at_once = block * cluster;
    pthread_t *threads = malloc(sizeof(pthread_t) * threads_at_once);
    job *jobs = malloc(sizeof(job) * threads_at_once);
    all_slots = malloc(sizeof(int64_t) * threads_at_once);
    all_frags = malloc(sizeof(uint32_t) * 6 * threads_at_once);
    ntid = block; nctaid = grid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (int32_t first = 0; first < grid; first += cluster) {
        pthread_barrier_init(&cluster_barrier, 0, threads_at_once);
        for (int32_t r = 0; r < cluster; r++) pthread_barrier_init(&block_barriers[r], 0, block);
        for (int32_t i = 0; i < threads_at_once; i++) {
            jobs[i] = (job){fns[i / block], nparams, params, first + i / block, i % block, i / block};
            if (pthread_create(&threads[i], &attr, run, &jobs[i])) return -1;
        }
        for (int32_t i = 0; i < threads_at_once; i++) pthread_join(threads[i], 0);
        for (int32_t r = 0; r < cluster; r++) pthread_barrier_destroy(&block_barriers[r]);
        pthread_barrier_destroy(&cluster_barrier);
    }
    free(threads); free(jobs); free(all_slots); free(all_frags);
    memset(mbarriers, 0, sizeof(mbarriers));  /* a launch's mbarriers end with it */
    return 0;
}
"""

_INTRINSICS = {
    "llvm.nvvm.read.ptx.sreg.tid.x": "emu_tid", "llvm.nvvm.read.ptx.sreg.ctaid.x": "emu_ctaid",
    "llvm.nvvm.read.ptx.sreg.ntid.x": "emu_ntid", "llvm.nvvm.read.ptx.sreg.nctaid.x": "emu_nctaid",
    "llvm.nvvm.barrier0": "emu_barrier", "llvm.nvvm.shfl.sync.bfly.i32": "emu_shfl",
    "llvm.nvvm.ex2.approx.f": "emu_ex2", "llvm.nvvm.lg2.approx.f": "emu_lg2",
    "llvm.nvvm.sqrt.approx.f": "emu_sqrt", "llvm.nvvm.rsqrt.approx.f": "emu_rsqrt",
    "llvm.nvvm.rcp.approx.ftz.f": "emu_rcp", "llvm.nvvm.ex2.approx.ftz.f": "emu_ex2_ftz",
    "llvm.nvvm.lg2.approx.ftz.f": "emu_lg2_ftz", "llvm.nvvm.sqrt.approx.ftz.f": "emu_sqrt_ftz",
    "llvm.nvvm.rsqrt.approx.ftz.f": "emu_rsqrt_ftz",
    "llvm.nvvm.cp.async.cg.shared.global.16.s": "emu_cp_async", "llvm.nvvm.cp.async.ca.shared.global.4.s": "emu_cp_async_4",
    "llvm.nvvm.cp.async.ca.shared.global.8.s": "emu_cp_async_8", "llvm.nvvm.cp.async.commit.group": "emu_cp_async_commit",
    "llvm.nvvm.cp.async.wait.group": "emu_cp_async_wait", "llvm.nvvm.f2tf32.rna": "emu_f2tf32",
    "llvm.nvvm.mapa.shared.cluster": "emu_mapa",
}
# Inline PTX the kernels emit (codegen/common.py), as the C functions that stand for it.
_ASM = {
    "barrier.cluster.arrive.relaxed.aligned; barrier.cluster.wait.aligned;": ("emu_cluster_barrier", "void @()"),
    "mbarrier.init.shared::cta.b64 [$0], $1; fence.mbarrier_init.release.cluster;":
        ("emu_mbarrier_init", "void @(ptr, i32)"),
    "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;": ("emu_expect_bytes", "void @(ptr, i32)"),
    "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; selp.u32 $0, 1, 0, done; }":
        ("emu_phase_done", "i32 @(ptr, i32)"),
    "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [$0], $1, [$2];": ("emu_send32", "void @(ptr, i32, ptr)"),
    "st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [$0], $1, [$2];": ("emu_send64", "void @(ptr, i64, ptr)"),
}
_CLUSTER_DIM = re.compile(r'"nvvm\.cluster_dim"="(\d+),1,1"')
_SHARED_GLOBAL = re.compile(r'^@"?(\w+_(?:smem\d+|dynamic_smem))"? = internal global \[(\d+) x (\w+)\]', re.M)
_SIZES = {"i1": 1, "i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}


def available() -> bool:
    return shutil.which("cc") is not None


@lru_cache(maxsize=None)
def _runtime() -> ctypes.CDLL:
    directory = tempfile.mkdtemp(prefix="glue-emu-")
    source, library = os.path.join(directory, "emu.c"), os.path.join(directory, "emu.so")
    with open(source, "w") as f:
        f.write(_RUNTIME)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-pthread", source, "-o", library, "-lm"], check=True)
    lib = ctypes.CDLL(library)
    for name in set(_INTRINSICS.values()) | {f for f, _ in _ASM.values()} | {"emu_bf16x2", "emu_ldmatrix", "emu_mma"}:
        llvm.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    lib.emu_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    lib.emu_set_shared.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
    lib.emu_ldmatrix_conflicts.restype = ctypes.c_int64
    return lib


def ldmatrix_conflicts() -> int:
    """The shared-memory wavefronts the ldmatrix instructions run since the last call spent on
    bank conflicts (beyond one for each 8 x 8 matrix)."""
    return _runtime().emu_ldmatrix_conflicts()


def host_ir(nvptx_ir: str) -> str:
    """The module retargeted to the host: no address spaces, plain functions, C intrinsics."""
    text = re.sub(r"\s*addrspace\(\d\)", "", nvptx_ir).replace("define ptx_kernel void", "define void")
    # dynamic shared memory: a block's worth, defined here (blocks run one after another)
    text = re.sub(r'^(@"?\w+_dynamic_smem"?) = external global \[0 x i8\]', r"\1 = internal global [262144 x i8] zeroinitializer",
                  text, flags=re.M)
    # cache hints and grid dependencies (blocks run one kernel at a time here): no-ops
    text = re.sub(r"^.*asm sideeffect \"(prefetch|griddepcontrol|membar|fence).*$", "", text, flags=re.M)
    text, packs = re.subn(r'asm\s+"cvt\.rn\.bf16x2\.f32 \$0, \$1, \$2;", "=r,f,f"', '@"emu_bf16x2"', text)
    if packs:
        text += '\ndeclare i32 @"emu_bf16x2"(float, float)\n'
    for asm, (function, signature) in _ASM.items():
        text, uses = re.subn(r'asm sideeffect "' + re.escape(asm) + r'", "[^"]*"', f'@"{function}"', text)
        if uses:
            text += f'\ndeclare {signature.replace("@", f"@{function}")}\n'
    for name, replacement in _INTRINSICS.items():
        text = text.replace(f'@"{name}"', f'@"{replacement}"').replace(f"@{name}(", f"@{replacement}(")
    used = [(name, shim, definition) for name, (shim, definition) in _COLLECTIVES.items() if name in text]
    for name, shim, definition in used:
        text = re.sub(rf"^declare .*@\"?{re.escape(name)}\"?\(.*$", "", text, flags=re.M)
        text = text.replace(f'@"{name}"', f"@{shim}").replace(f"@{name}(", f"@{shim}(") + definition
    if used:
        text += ("declare void @emu_ldmatrix(ptr, i32, ptr)\n"
                 "declare void @emu_mma(i32, i32, i32, i32, i32, i32, i32, float, float, float, float, ptr)\n")
    return text


def _ldmatrix_shim(name: str, trans: int) -> str:
    return f"""
define internal {{i32, i32, i32, i32}} @{name}(ptr %p) {{
  %out = alloca [4 x i32]
  call void @emu_ldmatrix(ptr %p, i32 {trans}, ptr %out)
  %r = load {{i32, i32, i32, i32}}, ptr %out
  ret {{i32, i32, i32, i32}} %r
}}
"""


def _mma_shim(name: str, operand: str, kind: int) -> str:
    words = "" if operand == "i32" else "".join(f"  %w{i} = bitcast {operand} %a{i} to i32\n" for i in range(6))
    word = "a" if operand == "i32" else "w"
    return f"""
define internal {{float, float, float, float}} @{name}({", ".join(f"{operand} %a{i}" for i in range(6))},
    float %c0, float %c1, float %c2, float %c3) {{
  %out = alloca [4 x float]
{words}  call void @emu_mma(i32 {kind}, {", ".join(f"i32 %{word}{i}" for i in range(6))}, float %c0, float %c1,
      float %c2, float %c3, ptr %out)
  %r = load {{float, float, float, float}}, ptr %out
  ret {{float, float, float, float}} %r
}}
"""


# Warp-collective intrinsics: an LLVM shim per intrinsic (struct results) over the C runtime.
_COLLECTIVES = {
    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3": ("emu_ldmatrix_x4", _ldmatrix_shim("emu_ldmatrix_x4", 0)),
    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16.p3":
        ("emu_ldmatrix_x4_trans", _ldmatrix_shim("emu_ldmatrix_x4_trans", 1)),
    "llvm.nvvm.mma.m16n8k16.row.col.bf16": ("emu_mma_bf16", _mma_shim("emu_mma_bf16", "i32", 0)),
    "llvm.nvvm.mma.m16n8k16.row.col.f32.f32": ("emu_mma_f16", _mma_shim("emu_mma_f16", "<2 x half>", 1)),
    "llvm.nvvm.mma.m16n8k8.row.col.tf32": ("emu_mma_tf32", _mma_shim("emu_mma_tf32", "i32", 2)),
}


class _Engine:
    """The program's kernels compiled for the host; a cluster kernel's module once for each
    rank of its cluster (`kernel(symbol)` gives every rank's copy)."""

    def __init__(self, nvptx_modules: dict[str, str]):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _runtime()
        module = llvm.parse_assembly("")
        self.cluster: dict[str, int] = {}
        self.shared: dict[str, list[tuple[str, int]]] = {}  # a cluster kernel's shared globals, bytes
        for symbol, text in nvptx_modules.items():  # one module per distinct kernel, linked into one
            host = host_ir(text)
            dim = _CLUSTER_DIM.search(text)
            self.cluster[symbol] = int(dim.group(1)) if dim else 1
            self.shared[symbol] = [(name, int(n) * _SIZES[t]) for name, n, t in _SHARED_GLOBAL.findall(host)]
            for rank in range(self.cluster[symbol]):
                module.link_in(llvm.parse_assembly(host.replace(f'@"{symbol}', f'@"{_ranked(symbol, rank)}')))
        module.verify()
        # The host's own features: F16C converts half precision without libcalls.
        target = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=1)
        self.engine = llvm.create_mcjit_compiler(module, target)
        self.engine.finalize_object()

    def kernel(self, symbol: str) -> tuple[list[int], int]:
        """Every rank's copy of the kernel, and its cluster's size; for a cluster kernel, its
        copies' shared memory is where `mapa` looks from now on."""
        ranks = self.cluster[symbol]
        if ranks > 1:
            shared = self.shared[symbol]
            bases = [self.engine.get_global_value_address(_ranked(symbol, rank) + name[len(symbol):])
                     for rank in range(ranks) for name, _ in shared]
            self._tables = ((ctypes.c_int64 * len(bases))(*bases), (ctypes.c_int64 * len(shared))(*[n for _, n in shared]))
            _runtime().emu_set_shared(len(shared), *self._tables)
        return [self.engine.get_function_address(_ranked(symbol, rank)) for rank in range(ranks)], ranks


def _ranked(symbol: str, rank: int) -> str:
    """A kernel's name in rank `rank`'s copy of its module (rank 0's is the original), which
    prefixes the copy's shared-memory globals as the kernel's name does the original's."""
    return symbol if rank == 0 else f"{symbol}__rank{rank}"


def _aligned(nbytes: int, fill: int) -> tuple[np.ndarray, int]:
    raw = np.full(nbytes + 512, fill, np.uint8)
    start = -raw.ctypes.data % 256
    return raw, raw.ctypes.data + start


def _view(gemm_view, address: int, batches: int, rows: int, cols: int) -> np.ndarray:
    """A (batches, rows, cols) strided view of memory at `address`, as a library reads it."""
    item = gemm_view.dtype.itemsize
    extent = (gemm_view.offset + (batches - 1) * gemm_view.batch_stride + (rows - 1) * gemm_view.row_stride
              + (cols - 1) * gemm_view.col_stride + 1) * item
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * extent).from_address(address))
    flat = raw.view(gemm_view.dtype.numpy)
    return np.lib.stride_tricks.as_strided(
        flat[gemm_view.offset:], (batches, rows, cols),
        tuple(s * item for s in (gemm_view.batch_stride, gemm_view.row_stride, gemm_view.col_stride)))


def _library_product(gemm, addresses: list[int]) -> None:
    """What cuBLASLt computes for a library launch: D = A @ B, summed in float32 (float64 for
    float64), rounded once to D's dtype."""
    batches, m, n, k = gemm.spec.shape
    a = _view(gemm.a, addresses[0], batches, m, k).astype(np.float64)
    b = _view(gemm.b, addresses[1], batches, k, n).astype(np.float64)
    d = _view(gemm.d, addresses[2], batches, m, n)
    wide = np.float64 if gemm.d.dtype.name == "f64" else np.float32
    d[...] = np.matmul(a, b).astype(wide).astype(d.dtype)


def _read(ptr: int, t) -> np.ndarray:
    data = np.ctypeslib.as_array((ctypes.c_uint8 * max(t.nbytes, 1)).from_address(ptr))[:t.nbytes]
    return data.copy().view(t.dtype.numpy).reshape(t.shape)


def _host(t, poison: int, keep: list, values: Any = None) -> int:
    """Host memory for a `t` buffer (aligned as device memory is), `values` in it or `poison`."""
    raw, ptr = _aligned(t.nbytes, poison)
    keep.append(raw)
    if values is not None:
        x = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=t.dtype.numpy), t.shape))
        np.ctypeslib.as_array((ctypes.c_uint8 * max(x.nbytes, 1)).from_address(ptr))[:x.nbytes] = \
            x.reshape(-1).view(np.uint8)
    return ptr


class _Machine:
    """Runs planned steps (glue.backend_cuda.steps) on host memory: kernels through the
    emulator, library products with NumPy, host calls through the scheduler's plan."""

    def __init__(self, planner: Planner, bases: list[int]):
        self.lib = _runtime()
        self.planner, self.bases = planner, bases
        self.engines: dict[int, _Engine] = {}

    def engine(self, program: CudaProgram) -> _Engine:
        if id(program) not in self.engines:
            self.engines[id(program)] = _Engine(program.llvm_modules())
        return self.engines[id(program)]

    def address(self, source: tuple[int, int]) -> int:
        return self.bases[source[0]] + source[1]

    def run(self, steps, parent: CudaProgram) -> None:
        for step in steps:
            if step.host is not None:
                run_call(step.host.site.plan, _EmulatedRunner(self, step))
                continue
            if step.copy:
                dst, src, nbytes = step.copy
                ctypes.memmove(self.address(dst), self.address(src), nbytes)
            launch = step.launch
            if launch is None:
                continue
            if launch.library is not None:
                _library_product(launch.library, [self.address(s) for s in step.sources])
                continue
            if launch.grid == 0:
                continue
            program = step.owner.program if step.owner is not None else parent
            params = (ctypes.c_void_p * max(len(step.sources), 1))(*[self.address(s) for s in step.sources])
            copies, cluster = self.engine(program).kernel(launch.symbol)
            fns = (ctypes.c_void_p * cluster)(*copies)
            if self.lib.emu_launch(fns, len(step.sources), params, launch.grid, launch.block, cluster):
                raise RuntimeError(f"emulator: could not start the threads of {launch.symbol}")


class _EmulatedRunner:
    """The scheduler's Runner for a host call: bodies run as planned steps."""

    def __init__(self, machine: _Machine, step):
        self.machine, self.step = machine, step

    def invoke(self, body: int, args, results) -> None:
        host, step = self.step.host, self.step
        steps = self.machine.planner.invocation_steps(host.site, body, [resolve_ref(host, r) for r in args],
                                                      [resolve_ref(host, r) for r in results], step.group, step.stream)
        self.machine.run(steps, None)

    def copy(self, source, target, t) -> None:
        host = self.step.host
        ctypes.memmove(self.machine.address(resolve_ref(host, target)), self.machine.address(resolve_ref(host, source)),
                       t.nbytes)

    def read(self, ref, t) -> np.ndarray:
        return _read(self.machine.address(resolve_ref(self.step.host, ref)), t)


def run_program(program: CudaProgram, args: Sequence[Any], poison: int = 0xFF,
                variant: str = "library") -> list[np.ndarray]:
    """Run the steps of `program` (its launches, call kernels expanded into their bodies' as
    glue.backend_cuda.steps plans them) on NumPy arguments; outputs, arena and scratch start
    as `poison`. A contraction with both variants runs `variant` (a library launch computes
    its product with NumPy, as the library would)."""
    keep: list = []
    arrays = [(_host(t, 0, keep, a), t) for a, t in zip(args, program.arg_types)]
    outs = [(_host(t, poison, keep), t) for t in program.output_types]
    arena = _aligned(program.arena_bytes, poison)
    scratch = [_aligned(n, poison) for n in program.scratch]
    counters = _aligned(program.counters, 0)
    keep += [arena[0]] + [raw for raw, _ in scratch] + [counters[0]]
    bases = [p for p, _ in arrays] + [p for p, _ in outs] + [arena[1]] + [p for _, p in scratch] + [counters[1]]
    n_args, n_outs = len(arrays), len(outs)

    def source(place) -> tuple[int, int]:
        base = {"argument": place.slot, "output": n_args + place.slot, "arena": n_args + n_outs,
                "scratch": n_args + n_outs + 1 + place.slot,
                "counters": n_args + n_outs + 1 + len(scratch)}[place.kind]
        return base, place.offset

    def choose(p: CudaProgram) -> list:
        return chosen_launches(p, {l.group: variant for l in p.launches if l.variant == variant})

    steps, planner = plan_program(program, choose(program), len(bases), source,
                                  lambda lowering: (choose(lowering["llvm"]), None))
    for region in planner.regions:
        if region.fill is not None:
            bases.append(_host(region.fill[0], 0, keep, region.fill[1]))
        else:
            raw, ptr = _aligned(region.nbytes, poison)
            keep.append(raw)
            bases.append(ptr)
    _Machine(planner, bases).run(steps, program)
    results = []
    for r in program.results:
        if r.kind == "literal":
            results.append(np.full(r.type.shape, r.value, r.type.dtype.numpy))
        elif r.kind == "output":
            results.append(_read(*outs[r.slot]))
        else:
            results.append(_read(arrays[r.slot][0], r.type))
    del keep
    return results
