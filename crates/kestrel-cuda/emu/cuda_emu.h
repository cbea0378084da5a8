// The kernels of kernels/*.cu on the CPU: what the CUDA C++ they use means, for g++.
//
// The emulated driver (driver.cpp) compiles the kernels' one translation unit with this
// header in front, as a shared library it loads as the "module". A launch shares the grid's
// blocks among a pool of OS threads; a block's threads are fibers on one OS thread, switched
// only where CUDA makes threads meet: __syncthreads, and the warp-wide instructions (shuffles,
// mma, ldmatrix, movmatrix, __syncwarp), which the last lane of the warp to arrive carries out
// for all of them. Fibers run in index order in even blocks and in reverse in odd ones, so a
// thread reading what another writes with no barrier between sees it unwritten in one of the
// two. A barrier or warp-wide instruction that live threads never reach, threads of a block
// at different __syncthreads, or a warp's lanes at different instructions are reported by
// name, as a GPU would hang or misbehave. Shared memory is `static thread_local`: one copy a
// block (an OS thread runs one block at a time). Not modelled: timing; cp.async copies land
// when issued (a missing wait goes unseen); stack and shared-memory overruns are not trapped.
#pragma once
#define KESTREL_EMU 1

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// CUDA's overloaded min / max (the usual arithmetic conversions decide the type)
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
    using T = std::common_type_t<A, B>;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
    using T = std::common_type_t<A, B>;
    return (T)a > (T)b ? (T)a : (T)b;
}

inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
inline unsigned __float_as_uint(float f) { return (unsigned)__float_as_int(f); }
inline float __uint_as_float(unsigned u) { return __int_as_float((int)u); }
inline int __float2int_rn(float f) { return (int)nearbyintf(f); }  // the default mode: to nearest even
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
// common.cuh's dp4a_us (PTX dp4a.u32.s32): a's bytes unsigned, b's signed
inline int dp4a_us(uint32_t a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(uint8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
// a - b on each signed byte, saturated
inline unsigned __vsubss4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        int d = (int)(int8_t)(a >> (8 * i)) - (int)(int8_t)(b >> (8 * i));
        d = d < -128 ? -128 : d > 127 ? 127 : d;
        r |= (unsigned)(uint8_t)d << (8 * i);
    }
    return r;
}
inline int __vsubss4(int a, int b) { return (int)__vsubss4((unsigned)a, (unsigned)b); }
template <class T>
inline T __ldcg(const T* p) {  // a load that skips L1: written by another block, read once
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}

inline float h2f(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}
inline uint16_t f2h_d(double f) {
    _Float16 v = (_Float16)f;  // round to nearest even, once
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
inline uint16_t f2h(float f) {
    _Float16 v = (_Float16)f;  // round to nearest even, as cvt.rn
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}

namespace emu {

// ---- fibers: one per CUDA thread of the running block ----

struct Fiber {
    void* sp;  // saved stack pointer while switched out
    dim3 tid;
    unsigned lane, warp;
    bool done;
    // while waiting: the generation counter it waits on and the value it waits to see change
    // (the scheduler passes it over without switching to it until then)
    const uint64_t* wait_on;
    uint64_t wait_while;
};

// A warp's meeting point: the lanes of `mask` post a record each; the last to arrive runs `fn`
// over all of them.
struct WarpMeet {
    uint32_t arrived = 0, mask = 0;
    uint64_t gen = 0;
    const char* what = nullptr;
    void (*fn)(void** recs, uint32_t mask) = nullptr;
    void* rec[32];
};

struct Block {
    Fiber* fibers = nullptr;
    unsigned n = 0, live = 0;
    WarpMeet warps[32];
    unsigned bar_arrived = 0;
    uint64_t bar_gen = 0;
    uint64_t progress = 0;
    void* sched_sp = nullptr;
    void (*thunk)(void**) = nullptr;
    void** params = nullptr;
    bool reverse = false;  // fibers run last to first
    int bar_line = 0;      // the source line of the __syncthreads being waited at
    const char* failure = nullptr;  // set when the block cannot go on
    char msg[256];
};

inline thread_local Fiber* cur = nullptr;
inline thread_local Block* blk = nullptr;
inline thread_local dim3 block_idx, block_dim, grid_dim;
// the running launch's number (PTX %gridid: distinct for every launch of the process)
inline thread_local unsigned long long grid_id;
inline std::atomic<unsigned long long> launches{0};
inline thread_local unsigned char* dyn_smem_buf = nullptr;

extern "C" void emu_swap(void** save_sp, void* to_sp);
// callee-saved registers on the stack, the stack pointer swapped (x86-64 System V)
asm(R"(
    .text
    .globl emu_swap
    .type emu_swap, @function
emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_swap, .-emu_swap
)");

inline void yield() { emu_swap(&cur->sp, blk->sched_sp); }

// Switches out until *gen moves past g.
inline void wait_for(const uint64_t* gen, uint64_t g) {
    cur->wait_on = gen;
    cur->wait_while = g;
    while (*gen == g) yield();
    cur->wait_on = nullptr;
}

[[noreturn]] inline void fail_block(const char* fmt, unsigned a, unsigned b) {
    snprintf(blk->msg, sizeof blk->msg, fmt, a, b);
    blk->failure = blk->msg;
    for (;;) yield();  // the scheduler never resumes a failed block
}

inline void release_barrier() {
    blk->bar_arrived = 0;
    blk->bar_gen++;
}

inline void syncthreads(int line) {
    if (blk->bar_arrived == 0) blk->bar_line = line;
    else if (blk->bar_line != line)
        fail_block("threads of the block wait at different __syncthreads (lines %u and %u of the kernels)",
                   (unsigned)blk->bar_line, (unsigned)line);
    blk->progress++;
    if (++blk->bar_arrived == blk->live) {
        release_barrier();
        return;
    }
    wait_for(&blk->bar_gen, blk->bar_gen);
}

inline void warp_meet(uint32_t mask, const char* what, void* rec, void (*fn)(void**, uint32_t)) {
    WarpMeet& w = blk->warps[cur->warp];
    unsigned lane = cur->lane;
    if (!(mask >> lane & 1)) fail_block("lane %u of warp %u calls a warp-wide instruction outside its mask", lane, cur->warp);
    if (w.arrived == 0) {
        w.mask = mask;
        w.what = what;
        w.fn = fn;
    } else if (w.mask != mask || w.what != what) {
        fail_block("the lanes of warp %u meet at different warp-wide instructions (lane %u)", cur->warp, lane);
    }
    w.rec[lane] = rec;
    w.arrived |= 1u << lane;
    blk->progress++;
    if (w.arrived == mask) {
        w.fn(w.rec, mask);
        w.arrived = 0;
        w.gen++;
        return;
    }
    wait_for(&w.gen, w.gen);
}

inline void fiber_main() {
    blk->thunk(blk->params);
    cur->done = true;
    blk->live--;
    blk->progress++;
    if (blk->bar_arrived > 0 && blk->bar_arrived == blk->live) release_barrier();
    for (;;) yield();
}

// Stacks for a block's fibers, kept per OS thread (64 KiB each, touched only as used).
struct Stacks {
    unsigned char* base = nullptr;
    unsigned count = 0;
};
inline thread_local Stacks stacks;
constexpr size_t STACK = 64 << 10;

inline unsigned char* stack_memory(unsigned n) {
    if (stacks.count < n) {
        if (stacks.base) munmap(stacks.base, (size_t)stacks.count * STACK);
        void* m = mmap(nullptr, (size_t)n * STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        stacks.base = m == MAP_FAILED ? nullptr : (unsigned char*)m;
        stacks.count = stacks.base ? n : 0;
    }
    return stacks.base;
}

// Dynamic shared memory (`extern __shared__`, rewritten by the driver into a call of this).
inline unsigned char* dyn_smem() { return dyn_smem_buf; }

// Runs one block to the end; false (and `blk->failure`) when it cannot finish.
inline bool run_block(Block& b) {
    blk = &b;
    unsigned char* mem = stack_memory(b.n);
    if (!mem) {
        snprintf(b.msg, sizeof b.msg, "no memory for the stacks of %u threads", b.n);
        b.failure = b.msg;
        return false;
    }
    for (unsigned i = 0; i < b.n; i++) {
        Fiber& f = b.fibers[i];
        f.tid = {i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
        f.lane = i % 32;
        f.warp = i / 32;
        f.done = false;
        f.wait_on = nullptr;
        // a fresh stack whose first switch "returns" into the entry (fiber_main) with the
        // alignment of a call (rsp = 8 mod 16 at entry): six zeroed registers, the entry,
        // a null return address for it
        uintptr_t top = ((uintptr_t)(mem + (size_t)(i + 1) * STACK)) & ~(uintptr_t)15;
        void** sp = (void**)(top - 64);
        for (int r = 0; r < 6; r++) sp[r] = nullptr;
        sp[6] = (void*)+[] { fiber_main(); };
        sp[7] = nullptr;
        f.sp = sp;
    }
    b.live = b.n;
    for (;;) {
        uint64_t before = b.progress;
        bool any = false;
        for (unsigned k = 0; k < b.n; k++) {
            Fiber& f = b.fibers[b.reverse ? b.n - 1 - k : k];
            if (f.done) continue;
            any = true;
            if (f.wait_on && *f.wait_on == f.wait_while) continue;  // still waiting
            cur = &f;
            emu_swap(&b.sched_sp, f.sp);
            if (b.failure) return false;
        }
        if (!any) return true;
        if (b.progress == before) {
            unsigned waiting = 0;
            for (unsigned w = 0; w < (b.n + 31) / 32; w++) waiting += b.warps[w].arrived != 0;
            snprintf(b.msg, sizeof b.msg,
                     "deadlock: %u of %u threads at __syncthreads, %u warp(s) waiting at a warp-wide "
                     "instruction for lanes that never come",
                     b.bar_arrived, b.live, waiting);
            b.failure = b.msg;
            return false;
        }
    }
}

// ---- warp-wide instructions ----

struct Shfl {
    uint64_t v;
    unsigned src;
    uint64_t out;
};
inline void shfl_fn(void** r, uint32_t mask) {
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        Shfl* s = (Shfl*)r[l];
        s->out = (mask >> s->src & 1) ? ((Shfl*)r[s->src])->v : s->v;
    }
}
template <class T>
inline T shfl(uint32_t mask, T v, unsigned src) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    Shfl s{0, src, 0};
    memcpy(&s.v, &v, sizeof(T));
    warp_meet(mask, "shfl", &s, shfl_fn);
    T out;
    memcpy(&out, &s.out, sizeof(T));
    return out;
}

inline void nop_fn(void**, uint32_t) {}

// f16 halves of a 32-bit register
inline float lo_half(uint32_t w) { return h2f((uint16_t)(w & 0xFFFF)); }
inline float hi_half(uint32_t w) { return h2f((uint16_t)(w >> 16)); }

struct MmaF16 {
    float* c;
    const uint32_t* a;
    uint32_t b0, b1;
};
inline void mma_f16_fn(void** r, uint32_t) {
    float A[16][16], B[16][8], C[16][8];
    for (unsigned l = 0; l < 32; l++) {
        MmaF16* m = (MmaF16*)r[l];
        unsigned g = l / 4, t = l % 4;
        const uint32_t* a = m->a;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = h ? hi_half(a[0]) : lo_half(a[0]);
            A[g + 8][2 * t + h] = h ? hi_half(a[1]) : lo_half(a[1]);
            A[g][8 + 2 * t + h] = h ? hi_half(a[2]) : lo_half(a[2]);
            A[g + 8][8 + 2 * t + h] = h ? hi_half(a[3]) : lo_half(a[3]);
            B[2 * t + h][g] = h ? hi_half(m->b0) : lo_half(m->b0);
            B[8 + 2 * t + h][g] = h ? hi_half(m->b1) : lo_half(m->b1);
        }
        C[g][2 * t] = m->c[0];
        C[g][2 * t + 1] = m->c[1];
        C[g + 8][2 * t] = m->c[2];
        C[g + 8][2 * t + 1] = m->c[3];
    }
    for (unsigned l = 0; l < 32; l++) {
        MmaF16* m = (MmaF16*)r[l];
        unsigned g = l / 4, t = l % 4;
        const unsigned rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int i = 0; i < 4; i++) {
            float acc = C[rows[i]][cols[i]];
            for (int k = 0; k < 16; k++) acc += A[rows[i]][k] * B[k][cols[i]];
            m->c[i] = acc;
        }
    }
}

template <int K>
struct MmaS8 {
    int* d;
    int a[K / 8];
    int b[K / 16];
    int z;
};
inline int8_t byte_of(int w, int i) { return (int8_t)(w >> (8 * i)); }
template <int K>
inline void mma_s8_fn(void** r, uint32_t) {
    int A[16][K], B[K][8];
    for (unsigned l = 0; l < 32; l++) {
        MmaS8<K>* m = (MmaS8<K>*)r[l];
        unsigned g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {
            A[g][4 * t + i] = byte_of(m->a[0], i);
            A[g + 8][4 * t + i] = byte_of(m->a[1], i);
            B[4 * t + i][g] = byte_of(m->b[0], i);
            if constexpr (K == 32) {
                A[g][16 + 4 * t + i] = byte_of(m->a[2], i);
                A[g + 8][16 + 4 * t + i] = byte_of(m->a[3], i);
                B[16 + 4 * t + i][g] = byte_of(m->b[1], i);
            }
        }
    }
    for (unsigned l = 0; l < 32; l++) {
        MmaS8<K>* m = (MmaS8<K>*)r[l];
        unsigned g = l / 4, t = l % 4;
        const unsigned rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int i = 0; i < 4; i++) {
            int acc = m->z;
            for (int k = 0; k < K; k++) acc += A[rows[i]][k] * B[k][cols[i]];
            m->d[i] = acc;
        }
    }
}

struct Ldsm {
    uint32_t* r;
    const uint16_t* p;  // this lane's row address
};
template <bool TRANS>
inline void ldsm_fn(void** rr, uint32_t) {
    uint16_t M[4][8][8];
    for (unsigned l = 0; l < 32; l++) {
        const uint16_t* p = ((Ldsm*)rr[l])->p;
        for (int c = 0; c < 8; c++) M[l / 8][l % 8][c] = p[c];
    }
    for (unsigned l = 0; l < 32; l++) {
        unsigned g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {
            uint16_t lo = TRANS ? M[i][2 * t][g] : M[i][g][2 * t];
            uint16_t hi = TRANS ? M[i][2 * t + 1][g] : M[i][g][2 * t + 1];
            ((Ldsm*)rr[l])->r[i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

struct Movm {
    uint32_t x, y;
};
inline void movmatrix_fn(void** rr, uint32_t) {
    uint16_t M[8][8];
    for (unsigned l = 0; l < 32; l++) {
        uint32_t x = ((Movm*)rr[l])->x;
        M[l / 4][2 * (l % 4)] = (uint16_t)(x & 0xFFFF);
        M[l / 4][2 * (l % 4) + 1] = (uint16_t)(x >> 16);
    }
    for (unsigned l = 0; l < 32; l++) {
        unsigned g = l / 4, t = l % 4;
        ((Movm*)rr[l])->y = (uint32_t)M[2 * t][g] | (uint32_t)M[2 * t + 1][g] << 16;
    }
}

// Kernel entry: the parameters as the driver passes them (one pointer to each value).
template <class... A, size_t... I>
inline void invoke_impl(void (*k)(A...), void** p, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}
template <class... A>
inline void invoke(void (*k)(A...), void** p) {
    invoke_impl(k, p, std::index_sequence_for<A...>{});
}
// Byte sizes of a kernel's parameters, 0-terminated (a captured launch copies their values).
template <class... A>
inline const int* param_sizes(void (*)(A...)) {
    static const int s[] = {(int)sizeof(A)..., 0};
    return s;
}

}  // namespace emu

// common.cuh's timeline stamps (PTX %globaltimer and %gridid)
inline unsigned long long tl_now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}
inline unsigned long long tl_grid() { return emu::grid_id; }

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads(int line = __builtin_LINE()) { emu::syncthreads(line); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_meet(mask, "syncwarp", nullptr, emu::nop_fn); }

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    unsigned lane = emu::cur->lane, base = lane & ~(unsigned)(width - 1);
    return emu::shfl(mask, v, base + ((unsigned)src & (unsigned)(width - 1)));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    unsigned lane = emu::cur->lane, src = lane ^ (unsigned)lane_mask;
    // a lane of a later group of `width` gets its own value back
    if ((src & ~(unsigned)(width - 1)) > (lane & ~(unsigned)(width - 1))) src = lane;
    return emu::shfl(mask, v, src);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    unsigned lane = emu::cur->lane, base = lane & ~(unsigned)(width - 1);
    return emu::shfl(mask, v, lane >= base + delta ? lane - delta : lane);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    unsigned lane = emu::cur->lane, base = lane & ~(unsigned)(width - 1);
    return emu::shfl(mask, v, lane + delta < base + (unsigned)width ? lane + delta : lane);
}

// The PTX helpers of common.cuh
inline void cp_async16(void* dst, const void* src, bool ok = true) {
    if (ok) memcpy(dst, src, 16);
    else memset(dst, 0, 16);
}
inline void cp_async8(void* dst, const void* src) { memcpy(dst, src, 8); }
// f16 pairs: each half computed exactly in double (products of halves are exact there) and
// rounded once to f16, as sub / mul / fma.rn.f16x2
inline uint32_t f16_pair(double lo, double hi) {
    return (uint32_t)f2h_d(lo) | ((uint32_t)f2h_d(hi) << 16);
}
inline uint32_t hsub2(uint32_t a, uint32_t b) {
    return f16_pair((double)emu::lo_half(a) - emu::lo_half(b), (double)emu::hi_half(a) - emu::hi_half(b));
}
inline uint32_t hmul2(uint32_t a, uint32_t b) {
    return f16_pair((double)emu::lo_half(a) * emu::lo_half(b), (double)emu::hi_half(a) * emu::hi_half(b));
}
inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
    return f16_pair((double)emu::lo_half(a) * emu::lo_half(b) + emu::lo_half(c),
                    (double)emu::hi_half(a) * emu::hi_half(b) + emu::hi_half(c));
}
// prmt.b32 (default mode) for selectors whose nibbles are 0-7: byte i of the result is byte
// (s >> 4 i) & 7 of {x, y}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = (uint64_t)x | ((uint64_t)y << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline void cp_async4(void* dst, const void* src) { memcpy(dst, src, 4); }
inline void cp_async_commit() {}
// copies land at once here: a kernel must not tell (it may not on a GPU either)
template <int N>
inline void cp_async_wait() {}
inline void prefetch_l2(const void*) {}
inline uint4 ldw16(const void* p) {
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
inline void mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    emu::MmaF16 m{c, a, b0, b1};
    emu::warp_meet(0xffffffffu, "mma.f16", &m, emu::mma_f16_fn);
}
inline void mma_s8_k32(int* d, int a0, int a1, int a2, int a3, int b0, int b1, int z) {
    emu::MmaS8<32> m{d, {a0, a1, a2, a3}, {b0, b1}, z};
    emu::warp_meet(0xffffffffu, "mma.s8.k32", &m, emu::mma_s8_fn<32>);
}
inline void mma_s8_k16(int* d, int a0, int a1, int b0, int z) {
    emu::MmaS8<16> m{d, {a0, a1}, {b0}, z};
    emu::warp_meet(0xffffffffu, "mma.s8.k16", &m, emu::mma_s8_fn<16>);
}
inline void ldsm_x4(uint32_t* r, const uint16_t* p) {
    emu::Ldsm m{r, p};
    emu::warp_meet(0xffffffffu, "ldmatrix", &m, emu::ldsm_fn<false>);
}
inline void ldsm_x4_t(uint32_t* r, const uint16_t* p) {
    emu::Ldsm m{r, p};
    emu::warp_meet(0xffffffffu, "ldmatrix.trans", &m, emu::ldsm_fn<true>);
}
inline uint32_t movmatrix_t(uint32_t x) {
    emu::Movm m{x, 0};
    emu::warp_meet(0xffffffffu, "movmatrix", &m, emu::movmatrix_fn);
    return m.y;
}

// ---- launches: the grid's blocks shared by a pool of OS threads ----

namespace emu {

struct Job {
    void (*thunk)(void**);
    unsigned grid[3], block[3], smem;
    void** params;
    std::atomic<unsigned long> next{0};
    unsigned long total = 0;
    unsigned long long grid_id = 0;
    std::atomic<bool> failed{false};
    std::mutex err_mu;
    char err[512] = {0};
};

// This OS thread's share of a job: blocks taken in order until none is left.
inline void work(Job& j) {
    static thread_local unsigned char* dyn = nullptr;
    static thread_local unsigned dyn_cap = 0;
    static thread_local Fiber* fibers = nullptr;
    static thread_local unsigned fibers_cap = 0;
    static thread_local Block b;
    unsigned n = j.block[0] * j.block[1] * j.block[2];
    if (j.smem > dyn_cap) {
        free(dyn);
        dyn = nullptr;
        dyn_cap = 0;
        if (posix_memalign((void**)&dyn, 128, j.smem) != 0) {
            std::lock_guard<std::mutex> g(j.err_mu);
            snprintf(j.err, sizeof j.err, "no memory for %u bytes of dynamic shared memory", j.smem);
            j.failed = true;
            return;
        }
        dyn_cap = j.smem;
    }
    if (n > fibers_cap) {
        delete[] fibers;
        fibers = new Fiber[n];
        fibers_cap = n;
    }
    dyn_smem_buf = dyn;
    grid_dim = {j.grid[0], j.grid[1], j.grid[2]};
    grid_id = j.grid_id;
    block_dim = {j.block[0], j.block[1], j.block[2]};
    for (;;) {
        unsigned long i = j.next.fetch_add(1);
        if (i >= j.total || j.failed) return;
        unsigned x = (unsigned)(i % j.grid[0]), y = (unsigned)(i / j.grid[0] % j.grid[1]),
                 z = (unsigned)(i / ((unsigned long)j.grid[0] * j.grid[1]));
        block_idx = {x, y, z};
        b = Block{};
        b.fibers = fibers;
        b.n = n;
        b.thunk = j.thunk;
        b.params = j.params;
        b.reverse = (x + y + z) & 1;
        if (!run_block(b)) {
            std::lock_guard<std::mutex> g(j.err_mu);
            if (!j.failed)
                snprintf(j.err, sizeof j.err, "block (%u, %u, %u) of (%u, %u, %u), %u threads: %s", x, y, z, j.grid[0],
                         j.grid[1], j.grid[2], n, b.failure);
            j.failed = true;
            return;
        }
    }
}

// Worker threads (KESTREL_CUDA_EMU_THREADS in all, the caller included; default: the CPUs,
// at most 8), started on the first grid of several blocks, joined when the module unloads.
struct Pool {
    std::vector<std::thread> threads;
    std::mutex m;
    std::condition_variable cv, done_cv;
    Job* job = nullptr;
    uint64_t gen = 0;
    unsigned busy = 0;
    bool quit = false;

    void start() {
        unsigned n = std::thread::hardware_concurrency();
        if (const char* v = getenv("KESTREL_CUDA_EMU_THREADS")) n = (unsigned)atoi(v);
        n = n < 1 ? 1 : n > 8 ? 8 : n;
        for (unsigned i = 1; i < n; i++) threads.emplace_back([this] { loop(); });
    }
    void loop() {
        uint64_t seen = 0;
        for (;;) {
            Job* j;
            {
                std::unique_lock<std::mutex> g(m);
                cv.wait(g, [&] { return quit || gen != seen; });
                if (quit) return;
                seen = gen;
                j = job;
                if (!j) continue;  // woke after the job was over
                busy++;
            }
            work(*j);
            std::lock_guard<std::mutex> g(m);
            if (--busy == 0) done_cv.notify_all();
        }
    }
    void run(Job& j) {
        if (j.total > 1 && threads.empty()) start();
        if (j.total > 1 && !threads.empty()) {
            {
                std::lock_guard<std::mutex> g(m);
                job = &j;
                gen++;
            }
            cv.notify_all();
            work(j);
            std::unique_lock<std::mutex> g(m);
            // every worker that took this job has left it (late ones find no block left)
            done_cv.wait(g, [&] { return busy == 0; });
            job = nullptr;
        } else {
            work(j);
        }
    }
    ~Pool() {
        {
            std::lock_guard<std::mutex> g(m);
            quit = true;
        }
        cv.notify_all();
        for (auto& t : threads) t.join();
    }
};
inline Pool pool;

}  // namespace emu

// The module's entry point: runs a grid; 0, or 1 with `err` filled.
extern "C" int emu_launch(void (*thunk)(void**), const unsigned* grid, const unsigned* block, unsigned smem,
                          void** params, char* err, int errlen) {
    emu::Job j;
    j.thunk = thunk;
    for (int i = 0; i < 3; i++) {
        j.grid[i] = grid[i];
        j.block[i] = block[i];
    }
    j.smem = smem;
    j.params = params;
    j.total = (unsigned long)grid[0] * grid[1] * grid[2];
    j.grid_id = ++emu::launches;
    emu::pool.run(j);
    if (j.failed) {
        snprintf(err, errlen, "%s", j.err);
        return 1;
    }
    return 0;
}
