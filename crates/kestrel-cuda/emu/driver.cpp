// A CUDA device emulated on the CPU, for checking what the kernels compute where no GPU is:
// the parts of the driver API (libcuda), NVRTC and cuBLAS that kestrel-cuda and cudarc call,
// in one shared library that scripts/cuda-emu.sh installs under those libraries' names.
//
// - Device memory is host memory (a device pointer is the host address); every operation runs
//   at once, in order, called from the calling thread (a kernel's blocks shared by a pool of
//   OS threads, cuda_emu.h), so streams and events only keep the API's shape.
// - NVRTC: the kernels' source is compiled by g++ with cuda_emu.h in front into a shared
//   library, which stands for the cubin; the "module" is that library, loaded with dlopen.
// - A stream being captured records kernel launches, copies and cuBLAS calls as a graph's
//   nodes (kernel parameters copied by value), a chain whose edges can be read and retyped
//   (programmatic edges); a graph launch replays the nodes in order.
// - cuBLAS: GemmEx with f32 / f16 / bf16 operands and f32 results, a plain loop.
// Nothing here models speed: timings taken on it measure the CPU.
#include <dlfcn.h>
#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#ifndef KESTREL_EMU_INCLUDE
#define KESTREL_EMU_INCLUDE "."
#endif

typedef int CUresult;
enum : int {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    INVALID_IMAGE = 200,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    LAUNCH_FAILED = 719,
    NOT_SUPPORTED = 801,
    UNKNOWN = 999,
};

namespace {

std::mutex mu;  // one caller at a time: the emulation is not reentrant

typedef int (*LaunchFn)(void (*)(void**), const unsigned*, const unsigned*, unsigned, void**, char*, int);

struct Module {
    void* lib;
    LaunchFn launch;
};
struct Func {
    Module* m;
    std::string name;
    void (*thunk)(void**);
    const int* sizes;      // parameter byte sizes, 0-terminated
    int max_dynamic_smem;  // opted into by cuFuncSetAttribute (48 KiB without)
};
struct Node {
    Func* f = nullptr;  // a kernel, or else `host` runs
    unsigned grid[3], block[3], smem = 0;
    std::vector<std::vector<unsigned char>> args;
    std::function<CUresult()> host;
};
// A graph edge as the API reports it (CUgraphEdgeData's fields: ports and type).
struct Edge {
    size_t from, to;
    unsigned char from_port, to_port, type;
};
// A captured graph: its nodes in capture order, each depending on the one before (a stream's
// capture is a chain); node handles point into `handles`, which never moves an element.
struct Graph {
    std::vector<Node> nodes;
    std::vector<Edge> edges;
    std::deque<std::pair<Graph*, size_t>> handles;
};
struct EdgeData {  // CUgraphEdgeData
    unsigned char from_port, to_port, type, reserved[5];
};
struct Stream {
    Graph* capture = nullptr;
};
struct Event {
    std::chrono::steady_clock::time_point t;
};

size_t allocated = 0;
std::map<void*, size_t> allocations;

size_t total_memory() {
    if (const char* v = getenv("KESTREL_CUDA_EMU_MEMORY")) return (size_t)strtoull(v, nullptr, 10);
    return (size_t)8 << 30;
}

// KESTREL_CUDA_EMU_TRACE=1: every launch on stderr with its grid and time.
const bool trace = getenv("KESTREL_CUDA_EMU_TRACE") && strcmp(getenv("KESTREL_CUDA_EMU_TRACE"), "0") != 0;

CUresult run_kernel(Func* f, const unsigned* grid, const unsigned* block, unsigned smem, void** params) {
    char err[512];
    auto t = std::chrono::steady_clock::now();
    int rc = f->m->launch(f->thunk, grid, block, smem, params, err, sizeof err);
    if (trace)
        fprintf(stderr, "emu: %-28s grid (%u, %u, %u) block (%u, %u, %u) smem %u: %.3f ms\n", f->name.c_str(), grid[0],
                grid[1], grid[2], block[0], block[1], block[2], smem,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    if (rc != 0) {
        fprintf(stderr, "kestrel CUDA emulation: kernel %s failed: %s\n", f->name.c_str(), err);
        return LAUNCH_FAILED;
    }
    return OK;
}

// Runs `op` now, or records it into the graph being captured on `s`.
CUresult run_or_record(void* s, std::function<CUresult()> op) {
    Stream* st = (Stream*)s;
    if (st && st->capture) {
        Node n;
        n.host = std::move(op);
        st->capture->nodes.push_back(std::move(n));
        return OK;
    }
    return op();
}

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The length of an ELF image from its header (section headers come last in a linked library).
size_t elf_size(const void* image) {
    const Elf64_Ehdr* h = (const Elf64_Ehdr*)image;
    if (memcmp(h->e_ident, ELFMAG, SELFMAG) != 0 || h->e_ident[EI_CLASS] != ELFCLASS64) return 0;
    return (size_t)h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
}

}  // namespace

extern "C" {

// ---- driver API ----

CUresult cuInit(unsigned) { return OK; }
CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return OK;
}
CUresult cuDeviceGetCount(int* n) {
    *n = 1;
    return OK;
}
CUresult cuDeviceGet(int* d, int ordinal) {
    if (ordinal != 0) return INVALID_VALUE;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetName(char* name, int len, int) {
    snprintf(name, len, "kestrel CUDA emulation (CPU)");
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t* b, int) {
    *b = total_memory();
    return OK;
}
// The device's compute capability: 9.0 (an H200: the Hopper paths), or KESTREL_CUDA_EMU_CC
// ("8.6", "7.5", ...) to see what kestrel does on another generation.
static void capability(int* major, int* minor) {
    *major = 9;
    *minor = 0;
    if (const char* v = getenv("KESTREL_CUDA_EMU_CC")) {
        if (sscanf(v, "%d.%d", major, minor) != 2) *minor = 0;
    }
}
// Shared memory a block may opt into and an SM holds, as those chips have it.
static int smem_optin(bool per_sm) {
    int major, minor;
    capability(&major, &minor);
    if (major >= 9) return per_sm ? 233472 : 232448;
    if (major == 8 && minor == 0) return per_sm ? 167936 : 166912;
    if (major == 8) return per_sm ? 102400 : 101376;
    return 65536;  // Turing: 64 KiB either way
}
CUresult cuDeviceGetAttribute(int* v, int attr, int) {
    int major, minor;
    capability(&major, &minor);
    switch (attr) {
        case 10: *v = 32; break;                 // warp size
        case 16: *v = 4; break;                  // SMs: grids sized by it stay small here
        case 75: *v = major; break;              // compute capability
        case 76: *v = minor; break;
        case 81: *v = smem_optin(true); break;   // shared memory an SM
        case 97: *v = smem_optin(false); break;  // shared memory a block may opt into
        case 8: *v = 49152; break;               // shared memory a block by default
        case 1: *v = 1024; break;                // threads a block
        case 115: *v = 0; break;                 // memory pools: plain allocations
        default: *v = 0;
    }
    return OK;
}
CUresult cuDeviceGetUuid(void* u, int) {
    memset(u, 0, 16);
    return OK;
}
CUresult cuDeviceGetUuid_v2(void* u, int) { return cuDeviceGetUuid(u, 0); }

static int the_context;
CUresult cuDevicePrimaryCtxRetain(void** ctx, int) {
    *ctx = &the_context;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int) { return OK; }
CUresult cuDevicePrimaryCtxRelease(int) { return OK; }
CUresult cuCtxSetCurrent(void*) { return OK; }
CUresult cuCtxGetCurrent(void** ctx) {
    *ctx = &the_context;
    return OK;
}
CUresult cuCtxPushCurrent_v2(void*) { return OK; }
CUresult cuCtxPopCurrent_v2(void** ctx) {
    if (ctx) *ctx = &the_context;
    return OK;
}
CUresult cuCtxGetDevice(int* d) {
    *d = 0;
    return OK;
}
CUresult cuCtxSynchronize() { return OK; }
CUresult cuCtxSetFlags(unsigned) { return OK; }
CUresult cuCtxGetStreamPriorityRange(int* lo, int* hi) {
    if (lo) *lo = 0;
    if (hi) *hi = 0;
    return OK;
}

CUresult cuStreamCreate(void** s, unsigned) {
    *s = new Stream();
    return OK;
}
CUresult cuStreamCreateWithPriority(void** s, unsigned, int) { return cuStreamCreate(s, 0); }
CUresult cuStreamDestroy_v2(void* s) {
    delete (Stream*)s;
    return OK;
}
CUresult cuStreamSynchronize(void*) { return OK; }
CUresult cuStreamQuery(void*) { return OK; }
CUresult cuStreamWaitEvent(void*, void*, unsigned) { return OK; }

CUresult cuEventCreate(void** e, unsigned) {
    *e = new Event{std::chrono::steady_clock::now()};
    return OK;
}
CUresult cuEventRecord(void* e, void*) {
    ((Event*)e)->t = std::chrono::steady_clock::now();
    return OK;
}
CUresult cuEventSynchronize(void*) { return OK; }
CUresult cuEventQuery(void*) { return OK; }
CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
    *ms = std::chrono::duration<float, std::milli>(((Event*)b)->t - ((Event*)a)->t).count();
    return OK;
}
CUresult cuEventElapsedTime_v2(float* ms, void* a, void* b) { return cuEventElapsedTime(ms, a, b); }
CUresult cuEventDestroy_v2(void* e) {
    delete (Event*)e;
    return OK;
}

CUresult cuMemGetInfo_v2(size_t* free_b, size_t* total_b) {
    std::lock_guard<std::mutex> g(mu);
    size_t t = total_memory();
    *total_b = t;
    *free_b = allocated < t ? t - allocated : 0;
    return OK;
}
CUresult cuMemAlloc_v2(uint64_t* p, size_t n) {
    std::lock_guard<std::mutex> g(mu);
    if (allocated + n > total_memory()) return OUT_OF_MEMORY;
    void* m = nullptr;
    if (posix_memalign(&m, 256, n ? n : 1) != 0) return OUT_OF_MEMORY;
    allocations[m] = n;
    allocated += n;
    *p = (uint64_t)m;
    return OK;
}
CUresult cuMemAllocAsync(uint64_t* p, size_t n, void*) { return cuMemAlloc_v2(p, n); }
CUresult cuMemFree_v2(uint64_t p) {
    std::lock_guard<std::mutex> g(mu);
    auto it = allocations.find((void*)p);
    if (it == allocations.end()) return INVALID_VALUE;
    allocated -= it->second;
    allocations.erase(it);
    free((void*)p);
    return OK;
}
CUresult cuMemFreeAsync(uint64_t p, void*) { return cuMemFree_v2(p); }
CUresult cuMemHostAlloc(void** p, size_t n, unsigned) {
    *p = malloc(n ? n : 1);
    return *p ? OK : OUT_OF_MEMORY;
}
CUresult cuMemAllocHost_v2(void** p, size_t n) { return cuMemHostAlloc(p, n, 0); }
CUresult cuMemFreeHost(void* p) {
    free(p);
    return OK;
}
CUresult cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
    memcpy((void*)dst, src, n);
    return OK;
}
CUresult cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
    memcpy(dst, (const void*)src, n);
    return OK;
}
CUresult cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
    memmove((void*)dst, (const void*)src, n);
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void* src, size_t n, void* s) {
    return run_or_record(s, [=] { return cuMemcpyHtoD_v2(dst, src, n); });
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, uint64_t src, size_t n, void* s) {
    return run_or_record(s, [=] { return cuMemcpyDtoH_v2(dst, src, n); });
}
CUresult cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void* s) {
    return run_or_record(s, [=] { return cuMemcpyDtoD_v2(dst, src, n); });
}
CUresult cuMemsetD8_v2(uint64_t dst, unsigned char v, size_t n) {
    memset((void*)dst, v, n);
    return OK;
}
CUresult cuMemsetD8Async(uint64_t dst, unsigned char v, size_t n, void* s) {
    return run_or_record(s, [=] { return cuMemsetD8_v2(dst, v, n); });
}
CUresult cuMemsetD32Async(uint64_t dst, unsigned v, size_t n, void* s) {
    return run_or_record(s, [=] {
        for (size_t i = 0; i < n; i++) ((unsigned*)dst)[i] = v;
        return (CUresult)OK;
    });
}

CUresult cuModuleLoadData(void** mod, const void* image) {
    size_t n = elf_size(image);
    if (n == 0) return INVALID_IMAGE;
    char path[] = "/tmp/kestrel-cuda-emu-module-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return UNKNOWN;
    bool ok = write(fd, image, n) == (ssize_t)n;
    close(fd);
    void* lib = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!lib) fprintf(stderr, "kestrel CUDA emulation: loading the module: %s\n", ok ? dlerror() : "write failed");
    unlink(path);
    if (!lib) return INVALID_IMAGE;
    LaunchFn launch = (LaunchFn)dlsym(lib, "emu_launch");
    if (!launch) return INVALID_IMAGE;
    *mod = new Module{lib, launch};
    return OK;
}
CUresult cuModuleUnload(void* mod) {
    Module* m = (Module*)mod;
    dlclose(m->lib);
    delete m;
    return OK;
}
CUresult cuModuleGetFunction(void** f, void* mod, const char* name) {
    Module* m = (Module*)mod;
    std::string k = std::string("emu_k_") + name, p = std::string("emu_ps_") + name;
    void* thunk = dlsym(m->lib, k.c_str());
    void* sizes = dlsym(m->lib, p.c_str());
    if (!thunk || !sizes) return NOT_FOUND;
    *f = new Func{m, name, (void (*)(void**))thunk, ((const int* (*)())sizes)(), 49152};
    return OK;
}
// A module's global variable (common.cuh's `kst_timeline`): the symbol in its library.
CUresult cuModuleGetGlobal_v2(uint64_t* dptr, size_t* bytes, void* mod, const char* name) {
    void* p = dlsym(((Module*)mod)->lib, name);
    if (!p) return NOT_FOUND;
    if (dptr) *dptr = (uint64_t)p;
    if (bytes) *bytes = sizeof(void*);  // the only globals the kernels define are pointers
    return OK;
}
CUresult cuFuncSetAttribute(void* f, int attr, int v) {
    if (attr == 8) {  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if (v < 0 || v > smem_optin(false)) return INVALID_VALUE;
        ((Func*)f)->max_dynamic_smem = v;
    }
    return OK;
}
CUresult cuFuncGetAttribute(int* v, int, void*) {
    *v = 0;
    return OK;
}
CUresult cuFuncSetCacheConfig(void*, int) { return OK; }
// Blocks an SM holds: by shared memory (1 KiB reserved a block) and 2,048 threads an SM; the
// emulation has no registers to count.
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, void*, int block, size_t smem, unsigned) {
    if (block <= 0 || block > 1024) return INVALID_VALUE;
    int by_smem = smem_optin(true) / (int)(smem + 1024), by_threads = 2048 / block;
    *n = by_smem < by_threads ? by_smem : by_threads;
    return OK;
}

CUresult cuLaunchKernel(void* fp, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void* s, void** params, void** extra) {
    if (extra) return NOT_SUPPORTED;
    Func* f = (Func*)fp;
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    // what a GPU refuses: empty or oversized grids and blocks, more dynamic shared memory
    // than the function opted into
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 || (unsigned long long)bx * by * bz > 1024 ||
        bz > 64 || smem > (unsigned)f->max_dynamic_smem) {
        fprintf(stderr, "kestrel CUDA emulation: launch of %s refused: grid (%u, %u, %u), block (%u, %u, %u), %u bytes of dynamic shared memory (%d allowed)\n",
                f->name.c_str(), gx, gy, gz, bx, by, bz, smem, f->max_dynamic_smem);
        return INVALID_VALUE;
    }
    Stream* st = (Stream*)s;
    if (st && st->capture) {
        Node n;
        n.f = f;
        memcpy(n.grid, grid, sizeof grid);
        memcpy(n.block, block, sizeof block);
        n.smem = smem;
        for (int i = 0; f->sizes[i]; i++) {
            const unsigned char* v = (const unsigned char*)params[i];
            n.args.emplace_back(v, v + f->sizes[i]);
        }
        st->capture->nodes.push_back(std::move(n));
        return OK;
    }
    std::lock_guard<std::mutex> g(mu);
    return run_kernel(f, grid, block, smem, params);
}

CUresult cuStreamBeginCapture_v2(void* s, int) {
    if (!s) return NOT_SUPPORTED;
    ((Stream*)s)->capture = new Graph();
    return OK;
}
CUresult cuStreamIsCapturing(void* s, int* status) {
    *status = s && ((Stream*)s)->capture ? 1 : 0;
    return OK;
}
CUresult cuStreamEndCapture(void* s, void** graph) {
    Stream* st = (Stream*)s;
    if (!st || !st->capture) return INVALID_VALUE;
    *graph = st->capture;
    st->capture = nullptr;
    return OK;
}
// The edges of the capture's chain, with the types kestrel gives them (graph.rs makes the ones
// into its own kernels programmatic); a launch runs the nodes in order whatever the types.
static void* node_handle(Graph* g, size_t i) {
    while (g->handles.size() < g->nodes.size()) g->handles.emplace_back(g, g->handles.size());
    return &g->handles[i];
}
static bool node_index(void* h, Graph*& g, size_t& i) {
    if (!h) return false;
    auto* p = (std::pair<Graph*, size_t>*)h;
    g = p->first;
    i = p->second;
    return i < g->nodes.size();
}
CUresult cuGraphGetNodes(void* graph, void** nodes, size_t* n) {
    Graph* g = (Graph*)graph;
    if (!nodes) {
        *n = g->nodes.size();
        return OK;
    }
    size_t k = 0;
    for (; k < *n && k < g->nodes.size(); k++) nodes[k] = node_handle(g, k);
    *n = k;
    return OK;
}
CUresult cuGraphGetEdges_v2(void* graph, void** from, void** to, void* data, size_t* n) {
    Graph* g = (Graph*)graph;
    if (g->edges.empty())
        for (size_t i = 1; i < g->nodes.size(); i++) g->edges.push_back({i - 1, i, 0, 0, 0});
    if (!from) {
        *n = g->edges.size();
        return OK;
    }
    size_t k = 0;
    for (; k < *n && k < g->edges.size(); k++) {
        const Edge& e = g->edges[k];
        from[k] = node_handle(g, e.from);
        to[k] = node_handle(g, e.to);
        if (data) ((EdgeData*)data)[k] = {e.from_port, e.to_port, e.type, {0}};
    }
    *n = k;
    return OK;
}
CUresult cuGraphNodeGetType(void* node, int* type) {
    Graph* g;
    size_t i;
    if (!node_index(node, g, i)) return INVALID_VALUE;
    *type = g->nodes[i].f ? 0 : 3;  // CU_GRAPH_NODE_TYPE_KERNEL, else _HOST (copies, cuBLAS)
    return OK;
}
// Only the function is filled: the first field of CUDA_KERNEL_NODE_PARAMS_v2.
CUresult cuGraphKernelNodeGetParams_v2(void* node, void** params) {
    Graph* g;
    size_t i;
    if (!node_index(node, g, i) || !g->nodes[i].f) return INVALID_VALUE;
    params[0] = g->nodes[i].f;
    return OK;
}
static CUresult change_edges(void* graph, void* const* from, void* const* to, const void* data, size_t n, bool add) {
    Graph* g = (Graph*)graph;
    for (size_t k = 0; k < n; k++) {
        Graph *gf, *gt;
        size_t a, b;
        if (!node_index(from[k], gf, a) || !node_index(to[k], gt, b) || gf != g || gt != g) return INVALID_VALUE;
        EdgeData d = data ? ((const EdgeData*)data)[k] : EdgeData{0, 0, 0, {0}};
        auto it = std::find_if(g->edges.begin(), g->edges.end(), [&](const Edge& e) {
            return e.from == a && e.to == b && e.type == d.type && e.from_port == d.from_port;
        });
        if (add) {
            if (it != g->edges.end()) return INVALID_VALUE;
            g->edges.push_back({a, b, d.from_port, d.to_port, d.type});
        } else {
            if (it == g->edges.end()) return INVALID_VALUE;
            g->edges.erase(it);
        }
    }
    return OK;
}
CUresult cuGraphRemoveDependencies_v2(void* graph, void* const* from, void* const* to, const void* data, size_t n) {
    return change_edges(graph, from, to, data, n, false);
}
CUresult cuGraphAddDependencies_v2(void* graph, void* const* from, void* const* to, const void* data, size_t n) {
    return change_edges(graph, from, to, data, n, true);
}
CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
    Graph* e = new Graph();
    e->nodes = ((Graph*)graph)->nodes;  // what a launch runs: the nodes, in order
    *exec = e;
    return OK;
}
CUresult cuGraphUpload(void*, void*) { return OK; }
CUresult cuGraphLaunch(void* exec, void*) {
    for (Node& n : ((Graph*)exec)->nodes) {
        CUresult r;
        if (n.f) {
            std::vector<void*> ptrs;
            for (auto& a : n.args) ptrs.push_back(a.data());
            std::lock_guard<std::mutex> g(mu);
            r = run_kernel(n.f, n.grid, n.block, n.smem, ptrs.data());
        } else {
            r = n.host();
        }
        if (r != OK) return r;
    }
    return OK;
}
CUresult cuGraphExecDestroy(void* e) {
    delete (Graph*)e;
    return OK;
}
CUresult cuGraphDestroy(void* g) {
    delete (Graph*)g;
    return OK;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
    switch (r) {
        case OK: *s = "no error"; break;
        case OUT_OF_MEMORY: *s = "out of memory (the emulated device's KESTREL_CUDA_EMU_MEMORY)"; break;
        case LAUNCH_FAILED: *s = "an emulated kernel failed (its message is on stderr)"; break;
        case NOT_FOUND: *s = "named symbol not found"; break;
        case NOT_SUPPORTED: *s = "not supported by the CUDA emulation"; break;
        default: *s = "error in the CUDA emulation"; break;
    }
    return OK;
}
CUresult cuGetErrorName(CUresult r, const char** s) {
    *s = r == OK ? "CUDA_SUCCESS" : r == LAUNCH_FAILED ? "CUDA_ERROR_LAUNCH_FAILED" : "CUDA_ERROR_EMULATION";
    return OK;
}

// ---- NVRTC ----

struct Program {
    std::string src, log, bin;
};

// How the kernels are built: -march=native (the module runs where it was compiled; F16C
// converts the halves), no strict aliasing and wrapping signed arithmetic, as a GPU reads them.
static const char CXXFLAGS[] = "-std=c++17 -O2 -march=native -fPIC -shared -w -fno-strict-aliasing -fwrapv";

// g++'s -fno-gnu-unique where the compiler takes it (clang makes no unique symbols and refuses
// the flag): each module keeps its own `inline` objects (the worker pool above all). As unique
// symbols they bound to the first module loaded, so a second module's launches started workers
// in the pool of the first; the second module unloaded (its code unmapped under the sleeping
// workers), the first one's pool woke them at exit into unmapped code: SIGSEGV after any
// `gpu-check --ops none -m MODEL`.
static std::string no_unique_flag(const std::string& cxx) {
    std::string probe = cxx + " -fno-gnu-unique -x c++ -E /dev/null > /dev/null 2>&1";
    return system(probe.c_str()) == 0 ? " -fno-gnu-unique" : "";
}

static std::string include_dir() {
    const char* v = getenv("KESTREL_CUDA_EMU_INCLUDE");
    return v ? v : KESTREL_EMU_INCLUDE;
}

int nvrtcVersion(int* major, int* minor) {
    // Not a real NVRTC version: kestrel's kernel cache keys on it. Major 0, so an emulated
    // "cubin" never meets a GPU's; minor from cuda_emu.h's text, so a changed emulation
    // compiles the kernels afresh.
    uint32_t h = 2166136261u;
    // (" no-unique": modules built before no_unique_flag are not served again)
    for (unsigned char c : read_file(include_dir() + "/cuda_emu.h") + CXXFLAGS + " no-unique") h = (h ^ c) * 16777619u;
    *major = 0;
    *minor = (int)(h % 1000000);
    return 0;
}
int nvrtcCreateProgram(void** prog, const char* src, const char*, int, const char* const*, const char* const*) {
    *prog = new Program{src, "", ""};
    return 0;
}
int nvrtcDestroyProgram(void** prog) {
    delete (Program*)*prog;
    *prog = nullptr;
    return 0;
}
const char* nvrtcGetErrorString(int r) { return r == 0 ? "NVRTC_SUCCESS" : "NVRTC_ERROR_COMPILATION"; }

int nvrtcCompileProgram(void* pp, int, const char* const*) {
    Program* p = (Program*)pp;
    char dir[] = "/tmp/kestrel-cuda-emu-XXXXXX";
    if (!mkdtemp(dir)) {
        p->log = "cannot make a temporary directory";
        return 6;
    }
    std::string d = dir;
    // dynamic shared memory: `extern __shared__ __align__(16) u8 smem[];` -> a pointer
    std::string src = std::regex_replace(
        p->src, std::regex(R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?(\w+)\s+(\w+)\s*\[\s*\]\s*;)"),
        "$1* $2 = ($1*)emu::dyn_smem();");
    std::ofstream(d + "/kernels.cu") << src;
    const char* cxx = getenv("CXX") ? getenv("CXX") : "g++";
    std::string inc = include_dir();
    // the kernels' names, from the preprocessed source (macros make many of them)
    std::string pre = std::string(cxx) + " -E -P -x c++ " + shell_quote(d + "/kernels.cu") + " -o " +
                      shell_quote(d + "/kernels.i") + " 2> " + shell_quote(d + "/log");
    int rc = system(pre.c_str());
    std::string expanded = read_file(d + "/kernels.i");
    std::string tu = "#include \"cuda_emu.h\"\n#include \"kernels.cu\"\n";
    std::regex kernel(R"(extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\()");
    int n = 0;
    for (auto it = std::sregex_iterator(expanded.begin(), expanded.end(), kernel); it != std::sregex_iterator(); ++it) {
        std::string k = (*it)[1];
        tu += "extern \"C\" void emu_k_" + k + "(void** p) { emu::invoke(" + k + ", p); }\n";
        tu += "extern \"C\" const int* emu_ps_" + k + "() { return emu::param_sizes(" + k + "); }\n";
        n++;
    }
    std::ofstream(d + "/module.cpp") << tu;
    if (rc == 0) {
        std::string cmd = std::string(cxx) + " " + CXXFLAGS + no_unique_flag(cxx) + " -I " + shell_quote(inc) +
                          " -I " + shell_quote(d) + " " + shell_quote(d + "/module.cpp") + " -o " +
                          shell_quote(d + "/module.so") + " 2>> " + shell_quote(d + "/log");
        rc = system(cmd.c_str());
    }
    p->log = read_file(d + "/log");
    if (rc == 0) p->bin = read_file(d + "/module.so");
    std::string rm = "rm -rf " + shell_quote(d);
    (void)!system(rm.c_str());  // a temporary directory left behind costs nothing
    if (rc != 0 || p->bin.empty() || n == 0) {
        if (n == 0) p->log += "\nno kernels found in the source";
        return 6;  // NVRTC_ERROR_COMPILATION
    }
    return 0;
}
int nvrtcGetProgramLogSize(void* p, size_t* n) {
    *n = ((Program*)p)->log.size() + 1;
    return 0;
}
int nvrtcGetProgramLog(void* p, char* out) {
    const std::string& l = ((Program*)p)->log;
    memcpy(out, l.c_str(), l.size() + 1);
    return 0;
}
int nvrtcGetCUBINSize(void* p, size_t* n) {
    *n = ((Program*)p)->bin.size();
    return 0;
}
int nvrtcGetCUBIN(void* p, char* out) {
    const std::string& b = ((Program*)p)->bin;
    memcpy(out, b.data(), b.size());
    return 0;
}

// ---- cuBLAS ----

struct Blas {
    void* stream = nullptr;
};
int cublasCreate_v2(void** h) {
    *h = new Blas();
    return 0;
}
int cublasDestroy_v2(void* h) {
    delete (Blas*)h;
    return 0;
}
int cublasSetStream_v2(void* h, void* s) {
    ((Blas*)h)->stream = s;
    return 0;
}

static float load_elem(const void* p, int type, size_t i) {
    switch (type) {
        case 0: return ((const float*)p)[i];
        case 2: {  // f16
            _Float16 v;
            memcpy(&v, (const char*)p + 2 * i, 2);
            return (float)v;
        }
        case 14: {  // bf16
            uint32_t b = (uint32_t)((const uint16_t*)p)[i] << 16;
            float f;
            memcpy(&f, &b, 4);
            return f;
        }
    }
    return NAN;
}

// C = alpha op(A) op(B) + beta C, column-major; C f32.
int cublasGemmEx(void* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at, int lda,
                 const void* B, int bt, int ldb, const void* beta, void* C, int ct, int ldc, int, int) {
    if (ct != 0 || (at != 0 && at != 2 && at != 14) || (bt != 0 && bt != 2 && bt != 14)) return 15;  // not supported
    float al = *(const float*)alpha, be = *(const float*)beta;
    auto op = [=]() -> CUresult {
        float* c = (float*)C;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.f;
                for (int p = 0; p < k; p++) {
                    float a = load_elem(A, at, ta ? (size_t)i * lda + p : (size_t)p * lda + i);
                    float b = load_elem(B, bt, tb ? (size_t)p * ldb + j : (size_t)j * ldb + p);
                    acc += a * b;
                }
                float& out = c[(size_t)j * ldc + i];
                out = al * acc + (be == 0.f ? 0.f : be * out);
            }
        return OK;
    };
    return run_or_record(((Blas*)h)->stream, op) == OK ? 0 : 14;
}

}  // extern "C"
