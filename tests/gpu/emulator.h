// The GPU built-ins the expert kernels may use (docs/gpu-kernel-subset.md), defined for a C++
// compiler on the CPU, so that the kernel sources, wrapped exactly as MLX wraps them, run here.
//
// Execution model: one threadgroup (CUDA block) at a time; each of its threads is a fiber
// (ucontext) with its own stack, run in lane order until it reaches a collective (simd_sum,
// a shuffle, a barrier) or ends. When every thread of the group has stopped, the collective is
// resolved for all of them at once (lock-step at every collective) and they resume. A group in
// which some threads wait at a collective while others have ended, or in which threads wait at
// different collectives, is an error (the GPU would hang or read undefined lanes): the launch
// stops and says so.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;

struct uint3 {
    uint x, y, z;
};
struct dim3 {
    uint x, y, z;
};

namespace ds4emu {

inline float half_to_float(uint16_t h) {
    uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 31u, man = h & 1023u, bits;
    if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 1024u));
        bits = sign | (uint32_t(112 - e) << 23) | ((man & 1023u) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

enum Kind { NONE = 0, SIMD_SUM = 1, SHFL_XOR = 2, BARRIER = 3 };
enum State { RUN, WAIT, DONE };

struct Lane {
    ucontext_t ctx;
    State state;
    int kind, arg;
    float value, result;
    uint3 local;
};

const int STACK = 64 * 1024;
const int MAX_LANES = 1024;
static Lane lanes[MAX_LANES];
static char* stacks = nullptr;
static ucontext_t scheduler;
static int current = 0, n_lanes = 0;
static char error[512];
static void (*entry)() = nullptr;

inline float collective(int kind, int arg, float v) {
    Lane& me = lanes[current];
    me.state = WAIT;
    me.kind = kind;
    me.arg = arg;
    me.value = v;
    swapcontext(&me.ctx, &scheduler);
    return lanes[current].result;
}

inline void lane_main() {
    entry();
    lanes[current].state = DONE;  // uc_link returns to the scheduler
}

// Resolve the collective every lane waits at; false (and `error`) when they disagree.
inline bool resolve(int width) {
    int kind = lanes[0].kind, arg = lanes[0].arg;
    for (int i = 0; i < n_lanes; i++) {
        if (lanes[i].kind != kind || lanes[i].arg != arg) {
            snprintf(error, sizeof error, "threads %d and %d wait at different collectives (%d/%d vs %d/%d)", 0,
                     i, kind, arg, lanes[i].kind, lanes[i].arg);
            return false;
        }
    }
    if (kind == SIMD_SUM || kind == SHFL_XOR) {
        if (n_lanes % width) {
            snprintf(error, sizeof error, "a simdgroup reduction or shuffle in a partial simdgroup (%d threads)",
                     n_lanes);
            return false;
        }
    }
    for (int i = 0; i < n_lanes; i++) {
        if (kind == SHFL_XOR) {
            int j = i ^ arg;
            if (arg < 0 || arg >= width) {
                snprintf(error, sizeof error, "shuffle offset %d outside a warp", arg);
                return false;
            }
            lanes[i].result = lanes[j].value;
        } else if (kind == SIMD_SUM) {
            // the butterfly order a hardware reduction uses (xor 16, 8, 4, 2, 1)
            int base = i - i % width;
            float v[64];
            for (int l = 0; l < width; l++) v[l] = lanes[base + l].value;
            for (int o = width / 2; o > 0; o /= 2) {
                float nv[64];
                for (int l = 0; l < width; l++) nv[l] = v[l] + v[l ^ o];
                memcpy(v, nv, sizeof(float) * width);
            }
            lanes[i].result = v[i % width];
        }
    }
    return true;
}

// Run one group of `n` threads; `before_resume(i)` sets the built-ins of lane i.
template <class F>
inline bool run_group(int n, F before_resume, int width) {
    if (stacks == nullptr) stacks = (char*)malloc((size_t)STACK * MAX_LANES);
    n_lanes = n;
    for (int i = 0; i < n; i++) {
        getcontext(&lanes[i].ctx);
        lanes[i].ctx.uc_stack.ss_sp = stacks + (size_t)STACK * i;
        lanes[i].ctx.uc_stack.ss_size = STACK;
        lanes[i].ctx.uc_link = &scheduler;
        makecontext(&lanes[i].ctx, lane_main, 0);
        lanes[i].state = RUN;
    }
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (lanes[i].state != RUN) continue;
            current = i;
            before_resume(i);
            swapcontext(&scheduler, &lanes[i].ctx);
        }
        int done = 0;
        for (int i = 0; i < n; i++) done += lanes[i].state == DONE;
        if (done == n) return true;
        if (done) {
            snprintf(error, sizeof error, "%d of %d threads ended while the others wait at a collective", done, n);
            return false;
        }
        if (!resolve(width)) return false;
        for (int i = 0; i < n; i++) lanes[i].state = RUN;
    }
}

}  // namespace ds4emu

// ---- Metal -----------------------------------------------------------------------------------
// Address spaces: `device` and `thread` vanish; `constant` (MLX passes inputs of fewer than 8
// elements there) becomes volatile, so a constant pointer handed where a device pointer is
// expected fails to compile here as it would on Metal.
#define device
#define thread
#define constant volatile
// Threadgroup memory: one group runs at a time and its fibers share one OS thread, so a static
// local is exactly one threadgroup's copy.
#define threadgroup static

struct half {
    uint16_t bits;
    operator float() const { return ds4emu::half_to_float(bits); }
};

template <class T, class U>
inline T as_type(U u) {
    static_assert(sizeof(T) == sizeof(U), "as_type between types of different sizes");
    T t;
    memcpy((void*)&t, (const void*)&u, sizeof t);
    return t;
}

namespace metal {
inline float simd_sum(float v) { return ds4emu::collective(ds4emu::SIMD_SUM, 0, v); }
}  // namespace metal

enum class mem_flags { mem_none, mem_device, mem_threadgroup };
inline void threadgroup_barrier(mem_flags) { ds4emu::collective(ds4emu::BARRIER, 0, 0.0f); }

// ---- CUDA ------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __forceinline__ inline
#define __grid_constant__
#define __shared__ static

namespace cooperative_groups {}

static dim3 threadIdx, blockIdx, blockDim, gridDim;

struct __half {
    uint16_t bits;
};
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline float __half2float(__half h) { return ds4emu::half_to_float(h.bits); }

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    if (mask != 0xffffffffu) {
        fprintf(stderr, "ds4emu: only full-warp shuffles are emulated\n");
        abort();
    }
    return ds4emu::collective(ds4emu::SHFL_XOR, lane_mask, v);
}
inline void __syncthreads() { ds4emu::collective(ds4emu::BARRIER, 0, 0.0f); }
