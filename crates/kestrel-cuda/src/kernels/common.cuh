// Shared by every kernel: fixed-width types, f16 conversion and warp reductions, with no
// header (NVRTC compiles this with no CUDA include path).
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Weight types as the host numbers them (kestrel_cuda::weights::Kind).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q5_0 3
#define T_Q8_0 4
#define T_Q4_K 5
#define T_Q6_K 6
#define T_Q4_1 7
#define T_Q5_1 8
#define T_Q5_K 9

// Programmatic dependent launch (decode graphs on sm_90+, device.rs turns their edges into
// programmatic ones): a kernel may be started while the one before it drains. Every kernel
// calls this first: it waits until the previous kernel has finished and its writes are
// visible (so a chain stays ordered through every link), then lets the next one be scheduled.
// Both are no-ops in a plain launch.
#if defined(KESTREL_TIMELINE)  // below: the same, with time stamps
#elif defined(KESTREL_EMU)
#define GRID_DEP() do {} while (0)  // kernels run one after another on the host
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_DEP() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_DEP() do {} while (0)
#endif

#ifdef KESTREL_TIMELINE
// KESTREL_CUDA_TIMELINE (timeline.rs): every launch stamps the global timer into slot
// (grid id % TL_SLOTS) of `kst_timeline`, spread over TL_SUBS copies by block so that its
// blocks' atomics do not queue on one address. The fields of a copy (zeroed by the host; a
// minimum is kept as the maximum of its complement): 0 the grid id + 1, 1 ~(first block at the
// wait), 2 ~(first block past it), 3 last block past it, 4 last warp's end, 5 blocks, 6 last
// block at the wait.
#define TL_SLOTS 4096
#define TL_SUBS 32
#define TL_FIELDS 8
extern "C" {
__device__ u64* kst_timeline;
}
#if !defined(KESTREL_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GRID_LAUNCH_NEXT() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_WAIT() do {} while (0)
#define GRID_LAUNCH_NEXT() do {} while (0)
#endif
#ifndef KESTREL_EMU
__device__ __forceinline__ u64 tl_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u64 tl_grid() {
    u64 g;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    return g;
}
#endif
// Read where used (volatile: nothing of the stamps is kept live in registers through the
// kernel, which would change its occupancy).
__device__ __forceinline__ u64* tl_buffer() { return *(u64* volatile*)&kst_timeline; }
__device__ __forceinline__ u64* tl_copy(u64* buf) {
    const u32 b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    return buf + ((tl_grid() % TL_SLOTS) * TL_SUBS + b % TL_SUBS) * TL_FIELDS;
}
__device__ __noinline__ void tl_end() {
    const u32 t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    if ((t & 31) == 0) {
        u64* buf = tl_buffer();
        if (buf) atomicMax(tl_copy(buf) + 4, tl_now());
    }
}
// Constructed past the wait (thread 0 stamps the block's start), destroyed at each thread's
// return (lane 0 of each warp stamps its end): declared by GRID_DEP in the kernel's scope.
struct TlBlock {
    __device__ TlBlock(u64 arrived) {
        u64* buf = tl_buffer();
        if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && buf) {
            const u64 now = tl_now();
            u64* c = tl_copy(buf);
            c[0] = tl_grid() + 1;
            atomicMax(c + 1, ~arrived);
            atomicMax(c + 6, arrived);
            atomicMax(c + 2, ~now);
            atomicMax(c + 3, now);
            atomicAdd(c + 5, 1ull);
        }
    }
    __device__ ~TlBlock() { tl_end(); }
};
#define GRID_DEP()                                                            \
    const u64 kst_arrived_ = threadIdx.x + threadIdx.y + threadIdx.z ? 0 : tl_now(); \
    GRID_WAIT();                                                              \
    TlBlock kst_block_(kst_arrived_);                                         \
    GRID_LAUNCH_NEXT()
#endif

// Inline assembly (PTX) sits in `#ifndef KESTREL_EMU` blocks: built with KESTREL_EMU (the
// host emulation of the kernels, emu/cuda_emu.h), that header gives each its meaning on the
// CPU instead.
#ifndef KESTREL_EMU
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// c + the dot of a's four unsigned bytes with b's four signed ones (CUDA's __dp4a takes both
// signed or both unsigned).
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// 16 bytes of weights (read once a step, never written by a kernel) by the read-only path, an
// L2 miss fetching the 256 bytes around it (the warp's next unit loads lie in them). L1 keeps
// them: a Q4_K unit's two quant words are halves of 32-byte sectors and four lanes share a
// block's header, the second reads served there (with L1::no_allocate the 8B's SwiGLU took 29
// us instead of 24, its tg128 -5%; H100, twenty-fifth session of docs/cuda.md).
__device__ __forceinline__ uint4 ldw16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
#endif
__device__ __forceinline__ int4 ldw16i(const void* p) {
    uint4 v = ldw16(p);
    return make_int4((int)v.x, (int)v.y, (int)v.z, (int)v.w);
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over a block of `blockDim.x` threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float s[32];
    v = warp_sum(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) s[w] = v;
    __syncthreads();
    v = l < (int)(blockDim.x >> 5) ? s[l] : 0.f;
    return warp_sum(v);
}
__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// Quantizes 32 consecutive values held one per lane to int8 with one scale (llama.cpp's
// Q8_1 activation blocks: d = amax / 127, q = round(x / d), s = d * sum(q)).
__device__ __forceinline__ void quant32(float v, i8* q, float2* ds) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.f;
    int qi = amax == 0.f ? 0 : __float2int_rn(v / d);
    q[lane] = (i8)qi;
    float s = warp_sum((float)qi);
    if (lane == 0) *ds = make_float2(d, d * s);
}


// 1 / rms of row xr of n (+ eps) for a block of 256 threads, every thread gets it: each thread
// sums its 16-byte pieces (four in flight), then block_sum. rms_norm_q and the norm folded into
// the q/k/v products (mvx_1_norm_rope) share it, so both get the same bits.
__device__ __forceinline__ float rms_scale_256(const float* __restrict__ xr, int n, float eps) {
    float s4[4] = {0.f, 0.f, 0.f, 0.f};
    int i = threadIdx.x;
    if ((n & 3) == 0) {
        const float4* x4 = (const float4*)xr;
        const int n4 = n / 4;
        for (; i + 3 * (int)blockDim.x < n4; i += 4 * blockDim.x) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = x4[i + j * blockDim.x];
#pragma unroll
            for (int j = 0; j < 4; j++) s4[j] += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        }
        for (; i < n4; i += blockDim.x) {
            float4 v = x4[i];
            s4[0] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (; i < n; i += blockDim.x) s4[0] += xr[i] * xr[i];
    }
    float ss = block_sum((s4[0] + s4[1]) + (s4[2] + s4[3]));
    return rsqrtf(ss / (float)n + eps);
}

// Four 32-value blocks of quant32 at once: lane l holds values 4 (l % 8) .. 4 (l % 8) + 3 of
// block l / 8, the warp values 0..127 from q. The same bytes and scales as quant32 (a maximum
// and a sum of integers, which no order changes), in three shuffles a reduction instead of five
// and a quarter of the rounds.
__device__ __forceinline__ void quant128(float4 v, i8* q, float2* ds) {
    const int lane = threadIdx.x & 31;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f;
    int q0 = 0, q1 = 0, q2 = 0, q3 = 0;
    if (amax != 0.f) {
        q0 = __float2int_rn(v.x / d);
        q1 = __float2int_rn(v.y / d);
        q2 = __float2int_rn(v.z / d);
        q3 = __float2int_rn(v.w / d);
    }
    ((u32*)q)[lane] = (u32)(q0 & 0xFF) | (u32)(q1 & 0xFF) << 8 | (u32)(q2 & 0xFF) << 16 | (u32)(q3 & 0xFF) << 24;
    int s = q0 + q1 + q2 + q3;
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((lane & 7) == 0) ds[lane >> 3] = make_float2(d, d * (float)s);
}

// The RMSNorm of row x (n a multiple of 32, weights w; both 16-byte aligned) as 8-bit blocks
// into q / qd, the whole row by one block of 256 threads (warp w quantizes values 128 w ..
// 128 w + 127, then 128 (w + 8) .., and a last part of less than 128 a block of 32 a warp):
// rms_norm_q's bytes.
__device__ __forceinline__ void norm_q_block(const float* __restrict__ x, const float* __restrict__ w, int n,
                                             float eps, i8* q, float2* qd) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float scale = rms_scale_256(x, n, eps);
    for (int base = warp * 128; base + 128 <= n; base += 1024) {
        const float4 xv = ((const float4*)(x + base))[lane], wv = ((const float4*)(w + base))[lane];
        const float4 v = make_float4(xv.x * scale * wv.x, xv.y * scale * wv.y, xv.z * scale * wv.z, xv.w * scale * wv.w);
        quant128(v, q + base, qd + base / 32);
    }
    for (int base = n / 128 * 128 + warp * 32; base < n; base += 256) {
        const int i = base + lane;
        quant32(x[i] * scale * w[i], q + base, qd + base / 32);
    }
}

// The warp-wide and asynchronous instructions (PTX).
#ifndef KESTREL_EMU

// f16 pairs (two halves a register): a - b, a * b, a * b + c, each rounded once.
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// A shared-memory pointer as the 32-bit address that ldmatrix / cp.async take.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared without a register (bypassing L1); `ok` false fills zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok = true) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0));
}
// 8 or 4 bytes global -> shared (these sizes go through L1).
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Pulls the 128-byte line at p into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Fragments of the warp-wide matrix instructions (gid = lane / 4, tid = lane % 4):
// mma m16n8k16 f16 -> f32: c += A (16x16, row) B (16x8, col); a[0..3] = A[gid][2tid..],
// A[gid + 8][2tid..], A[gid][8 + 2tid..], A[gid + 8][8 + 2tid..] (two halves a register);
// b0 = B[2tid..][gid], b1 = B[8 + 2tid..][gid]; c[0..3] = C[gid][2tid], C[gid][2tid + 1],
// C[gid + 8][2tid], C[gid + 8][2tid + 1].
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// mma m16n8k32 s8 -> s32: d = A (16x32) B (32x8) + z in every element; a0 = A[gid][4tid..],
// a1 = A[gid + 8][4tid..], a2 = A[gid][16 + 4tid..], a3 = A[gid + 8][16 + 4tid..] (four bytes
// a register); b0 = B[4tid..][gid], b1 = B[16 + 4tid..][gid]; d as c above.
__device__ __forceinline__ void mma_s8_k32(int* d, int a0, int a1, int a2, int a3, int b0, int b1, int z) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(z));
}
// mma m16n8k16 s8 -> s32: (a0, a1) and b0 as the first halves of m16n8k32's.
__device__ __forceinline__ void mma_s8_k16(int* d, int a0, int a1, int b0, int z) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(z));
}
// Four 8x8 f16 matrices from shared memory: lanes 8i .. 8i + 7 give the row addresses of
// matrix i; r[i] = M_i[gid][2tid..] (two halves), or with _t the transpose's.
__device__ __forceinline__ void ldsm_x4(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// The transpose of an 8x8 f16 matrix held as above (a register a lane: row gid, 2tid..).
__device__ __forceinline__ u32 movmatrix_t(u32 x) {
    u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
#endif  // KESTREL_EMU
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
