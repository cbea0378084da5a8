// The emulation's own checks (scripts/cuda-emu.sh builds and runs this): shuffles against
// CUDA's documented rules, and the faults it must report instead of hanging or passing: a
// barrier or shuffle that live threads never reach, threads at different __syncthreads, lanes
// of a warp at different warp-wide instructions; and a read of shared memory with no barrier
// after its write seeing the slot unwritten.
// Exit status 0 when every check holds; each failed check is one line on stderr.
#include "cuda_emu.h"

static int failures = 0;
#define CHECK(cond, ...)                       \
    do {                                       \
        if (!(cond)) {                         \
            fprintf(stderr, "selftest: " __VA_ARGS__); \
            fputc('\n', stderr);               \
            failures++;                        \
        }                                      \
    } while (0)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void shuffles(int* out) {
    int lane = threadIdx.x & 31, w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int* o = out + 32 * 6 * w;
    o[lane] = __shfl_xor_sync(0xffffffffu, lane, 5);
    o[32 + lane] = __shfl_up_sync(0xffffffffu, lane, 3);
    o[64 + lane] = __shfl_down_sync(0xffffffffu, lane, 3, 8);
    o[96 + lane] = __shfl_sync(0xffffffffu, lane * 10, 7, 16);
    o[128 + lane] = __shfl_xor_sync(0xffffffffu, lane, 8, 8);  // a later group of 8: own value
    float s = warp_sum((float)lane);
    o[160 + lane] = (int)s;
}
// warp 0 waits at the barrier for warp 1, whose lanes wait at a shuffle for lanes that left
extern "C" __global__ void partial_barrier(int* out) {
    if (threadIdx.x >= 48) return;
    if (threadIdx.x < 32) __syncthreads();
    else out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}
extern "C" __global__ void mixed_meeting(int* out) {
    int lane = threadIdx.x & 31;
    if (lane < 16) out[lane] = __shfl_xor_sync(0xffffffffu, lane, 1);
    else __syncwarp();
}
extern "C" __global__ void exited_barrier(int* out) {
    // threads that returned do not hold a barrier up (as on sm_70+)
    if (threadIdx.x >= 64) return;
    __syncthreads();
    out[threadIdx.x] = 2;
}

extern "C" __global__ void split_barriers(int* out) {
    if (threadIdx.x < 32) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 3;
}
// each thread reads its neighbour's shared slot with no barrier between the write and the read
extern "C" __global__ void unsynced_read(int* out) {
    __shared__ int s[64];
    s[threadIdx.x] = 1 + blockIdx.x;
    out[blockIdx.x * 64 + threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

static int launch(void (*k)(void**), unsigned blocks, unsigned threads, int* out, char* err) {
    unsigned grid[3] = {blocks, 1, 1}, block[3] = {threads, 1, 1};
    void* p[1] = {&out};
    return emu_launch(k, grid, block, 0, p, err, 512);
}

int main() {
    static int out[4096];
    char err[512];
    CHECK(launch([](void** p) { emu::invoke(shuffles, p); }, 2, 64, out, err) == 0, "shuffles: %s", err);
    for (int w = 0; w < 4; w++)
        for (int l = 0; l < 32; l++) {
            const int* o = out + 32 * 6 * w;
            CHECK(o[l] == (l ^ 5), "xor: lane %d got %d", l, o[l]);
            CHECK(o[32 + l] == (l >= 3 ? l - 3 : l), "up: lane %d got %d", l, o[32 + l]);
            CHECK(o[64 + l] == ((l % 8) + 3 < 8 ? l + 3 : l), "down width 8: lane %d got %d", l, o[64 + l]);
            CHECK(o[96 + l] == ((l & ~15) + 7) * 10, "idx width 16: lane %d got %d", l, o[96 + l]);
            int src = l ^ 8, want = (src & ~7) > (l & ~7) ? l : src;
            CHECK(o[128 + l] == want, "xor across groups of 8: lane %d got %d", l, o[128 + l]);
            CHECK(o[160 + l] == 496, "warp sum: lane %d got %d", l, o[160 + l]);
        }
    int rc = launch([](void** p) { emu::invoke(partial_barrier, p); }, 1, 64, out, err);
    CHECK(rc == 1 && strstr(err, "deadlock"), "a barrier and a shuffle waiting on each other: rc %d, '%s'", rc,
          rc ? err : "");
    rc = launch([](void** p) { emu::invoke(mixed_meeting, p); }, 1, 32, out, err);
    CHECK(rc == 1 && strstr(err, "different warp-wide"), "lanes at different warp-wide instructions: rc %d, '%s'",
          rc, rc ? err : "");
    rc = launch([](void** p) { emu::invoke(exited_barrier, p); }, 3, 128, out, err);
    CHECK(rc == 0 && out[0] == 2 && out[63] == 2, "a barrier after some threads returned: rc %d, '%s'", rc,
          rc ? err : "");
    rc = launch([](void** p) { emu::invoke(split_barriers, p); }, 1, 64, out, err);
    CHECK(rc == 1 && strstr(err, "different __syncthreads"), "threads at different __syncthreads: rc %d, '%s'", rc,
          rc ? err : "");
    // one of the two orders (forward in block 0, reverse in block 1) reads a slot unwritten
    memset(out, 0, sizeof out);
    rc = launch([](void** p) { emu::invoke(unsynced_read, p); }, 2, 64, out, err);
    int stale = 0;
    for (int i = 0; i < 128; i++) stale += out[i] != 1 + i / 64;
    CHECK(rc == 0 && stale > 0, "a read with no barrier after the write was never stale: rc %d", rc);
    if (failures == 0) printf("selftest: all checks hold\n");
    return failures ? 1 : 0;
}
