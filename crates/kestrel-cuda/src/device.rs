//! One GPU: its context, the stream every kernel runs on, the compiled kernels, cuBLAS, and
//! device buffers addressed by raw pointer (kernels take plain pointers, and a captured graph
//! keeps them: buffers are allocated once and never move).

use crate::error::{CudaError, Result};
use crate::{compile, probe};
use cudarc::cublas::sys as bsys;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// A device allocation and its address.
pub struct DevBuf {
    _slice: CudaSlice<u8>,
    pub ptr: u64,
    pub bytes: usize,
}

/// The engine's logits in page-locked host memory ([`kestrel_engine::LogitsMemory`]): the
/// step's download lands there by DMA, and the engine samples from it where it lies.
pub struct PinnedLogits {
    ctx: Arc<CudaContext>,
    /// The allocation, and its address and length (floats) taken once.
    mem: Option<(cudarc::driver::PinnedHostSlice<f32>, *mut f32, usize)>,
}

// SAFETY: the pointer is into `mem`'s own allocation, owned by this value and moved with it;
// nothing else aliases it.
unsafe impl Send for PinnedLogits {}

impl PinnedLogits {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        PinnedLogits { ctx, mem: None }
    }
}

impl kestrel_engine::LogitsMemory for PinnedLogits {
    fn as_slice(&self) -> &[f32] {
        match &self.mem {
            // SAFETY: ptr and len describe the live pinned allocation held beside them; every
            // f32 bit pattern is valid (stale contents are allowed by the contract).
            Some((_, ptr, len)) => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            None => &[],
        }
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        match &mut self.mem {
            // SAFETY: as in as_slice; `&mut self` makes this the only reference.
            Some((_, ptr, len)) => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
            None => &mut [],
        }
    }
    fn reserve(&mut self, n: usize) -> std::result::Result<(), String> {
        if self.mem.as_ref().is_some_and(|m| m.2 >= n) {
            return Ok(());
        }
        self.mem = None; // free the old one first
                         // SAFETY: the memory is read only after a download wrote it (stale floats otherwise,
                         // which the contract allows); flags 0: cached (the host reads it), not write-combined.
        let mut slice = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(n.max(1), 0) }
            .map_err(|e| format!("page-locked memory for {n} logits: {e}"))?;
        let ptr = slice
            .as_mut_ptr()
            .map_err(|e| format!("page-locked memory for {n} logits: {e}"))?;
        // zeroed once, so no read ever sees uninitialized memory
        // SAFETY: ptr points to n.max(1) floats just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, n.max(1)) };
        self.mem = Some((slice, ptr, n.max(1)));
        Ok(())
    }
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    funcs: HashMap<String, CudaFunction>,
    /// Blocks of a kernel the GPU runs at once ([`Gpu::wave`]), by kernel name (a mat-mat's name
    /// fixes its block and shared memory).
    waves: HashMap<String, usize>,
    blas: bsys::cublasHandle_t,
    pub name: String,
    pub arch: String,
    pub sms: u32,
    /// Shared memory a block may take (opted in above 48 KiB) and an SM holds, bytes (227 /
    /// 228 KiB on Hopper, 99 / 100 KiB on sm_86 / sm_89).
    pub smem_per_block: usize,
    pub smem_per_sm: usize,
    /// Milliseconds spent compiling (or loading from the cache) the kernels, and whether the
    /// cache served them.
    pub kernels_ms: f64,
    pub kernels_cached: bool,
    /// Device-memory bandwidth that figures are set against, bytes/s, and where it comes from:
    /// the H200's measured read rate (4.65 TB/s, the figure the issues use), else the peak of
    /// the memory clock x bus width the driver reports (None where it reports neither).
    pub mem_bandwidth: Option<(f64, &'static str)>,
}

// SAFETY: the handles inside (context, stream, module, cuBLAS handle) are used by one thread
// at a time (the model's owner: the CLI or the engine thread); every entry point binds the
// context to the calling thread first (`Gpu::bind`).
unsafe impl Send for Gpu {}

/// Parses `cuda`, `cuda:N`.
pub fn parse_ordinal(device: &str) -> Option<usize> {
    match device {
        "cuda" => Some(0),
        d => d.strip_prefix("cuda:").and_then(|n| n.parse().ok()),
    }
}

impl Gpu {
    /// Opens device `ordinal`: probes the libraries first, so a machine without CUDA gets one
    /// line ("no CUDA device found: ...") instead of an abort inside a library loader.
    pub fn open(ordinal: usize) -> Result<Self> {
        let n = probe::device_count()?;
        if n == 0 {
            return Err(CudaError::NoDevice("the driver reports no GPU".into()));
        }
        if ordinal >= n {
            return Err(CudaError::NoDevice(format!(
                "cuda:{ordinal} asked for, but the driver reports {n} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        // Kernels are ordered on one stream; per-launch event bookkeeping would only add host
        // work and gets in the way of graph capture.
        // SAFETY: called before any allocation on this context.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (maj, min) = ctx.compute_capability()?;
        if maj < 8 {
            // the mat-mats' int8 mma (m16n8k32) and cp.async are sm_80 instructions: say so
            // before NVRTC fails on them
            return Err(CudaError::Unsupported(format!(
                "{} (compute capability {maj}.{min}): its kernels need 8.0 or newer (Ampere, Ada, Hopper, Blackwell); use --device cpu",
                ctx.name()?
            )));
        }
        let arch = format!("sm_{maj}{min}");
        let t = Instant::now();
        let (bin, cached) = compile::cubin(&arch, false)?;
        let (module, cached) = match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin)) {
            Ok(m) => (m, cached),
            // a cubin compiled elsewhere that this driver refuses (a newer NVRTC's): compile here
            Err(_) if std::env::var_os(compile::CUBINS_ENV).is_some() => {
                let (bin, _) = compile::cubin(&arch, true)?;
                (
                    ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin))?,
                    false,
                )
            }
            Err(e) => return Err(e.into()),
        };
        let kernels_ms = t.elapsed().as_secs_f64() * 1e3;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1) as u32;
        let smem_per_block = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .unwrap_or(48 << 10) as usize;
        let smem_per_sm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )
            .unwrap_or(smem_per_block as i32) as usize;
        let attr = |a| ctx.attribute(a).ok().filter(|&v| v > 0).map(|v| v as f64);
        let name = ctx.name()?;
        let mem_bandwidth = if name.contains("H200") {
            Some((4.65e12, "the H200's measured read rate"))
        } else {
            use sys::CUdevice_attribute as A;
            // kHz, double data rate, bits
            match (
                attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
                attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
            ) {
                (Some(khz), Some(bits)) => {
                    Some((khz * 1e3 * 2.0 * bits / 8.0, "memory clock x bus width"))
                }
                _ => None,
            }
        };
        let mut blas: bsys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: creates a handle and binds it to our stream.
        unsafe {
            blas_ok(bsys::cublasCreate_v2(&mut blas), "create")?;
            blas_ok(
                bsys::cublasSetStream_v2(blas, stream.cu_stream() as _),
                "set stream",
            )?;
        }
        Ok(Self {
            name,
            ctx,
            stream,
            module,
            funcs: HashMap::new(),
            waves: HashMap::new(),
            blas,
            arch,
            sms,
            smem_per_block,
            smem_per_sm,
            kernels_ms,
            kernels_cached: cached,
            mem_bandwidth,
        })
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    pub fn func(&mut self, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.funcs.get(name) {
            return Ok(f.clone());
        }
        let f = self.module.load_function(name)?;
        self.funcs.insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Kernel `name`, allowed `smem` bytes of dynamic shared memory a block (an opt-in above
    /// the default 48 KiB).
    pub fn func_with_smem(&mut self, name: &str, smem: u32) -> Result<CudaFunction> {
        let f = self.func(name)?;
        if smem > 48 << 10 {
            f.set_attribute(
                sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )?;
        }
        Ok(f)
    }

    /// Blocks of kernel `name` in blocks of `block` threads with `smem` bytes of dynamic shared
    /// memory that the GPU runs at once (its SMs times what one holds by registers, shared
    /// memory and threads): one wave of the launch. Kept by name: a kernel is always launched
    /// in the same block and shared memory.
    pub fn wave(&mut self, name: &str, block: u32, smem: u32) -> Result<usize> {
        if let Some(&n) = self.waves.get(name) {
            return Ok(n);
        }
        let f = self.func_with_smem(name, smem)?;
        let per_sm =
            f.occupancy_max_active_blocks_per_multiprocessor(block, smem as usize, None)?;
        let n = self.sms as usize * per_sm.max(1) as usize;
        self.waves.insert(name.to_string(), n);
        Ok(n)
    }

    /// The kernels loaded so far, as function handles (addresses): what a captured graph's
    /// kernel nodes run when they are ours ([`crate::graph`]).
    pub(crate) fn kernel_funcs(&self) -> std::collections::HashSet<usize> {
        self.funcs
            .values()
            .map(|f| f.cu_function() as usize)
            .collect()
    }

    /// The name of the loaded kernel whose function handle is `addr`.
    pub(crate) fn kernel_name(&self, addr: usize) -> Option<&str> {
        self.funcs
            .iter()
            .find(|(_, f)| f.cu_function() as usize == addr)
            .map(|(name, _)| name.as_str())
    }

    /// Sets the kernels' global pointer variable `name` (an `extern "C" __device__` one) to
    /// device address `value`.
    pub(crate) fn set_global_ptr(&self, name: &str, value: u64) -> Result<()> {
        let global = self.module.get_global(name, &self.stream)?;
        if global.len() != 8 {
            return Err(CudaError::Other(format!(
                "the kernels' `{name}` is {} bytes, not a pointer",
                global.len()
            )));
        }
        let (at, _sync) = global.device_ptr(&self.stream);
        self.write(at, &value.to_le_bytes())?;
        self.stream.synchronize()?;
        Ok(())
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        // SAFETY: every buffer is written before it is read (uploads, kernels).
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(16))? };
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _slice: slice,
            ptr,
            bytes,
        })
    }

    pub fn upload(&self, host: &[u8]) -> Result<DevBuf> {
        let slice = self.stream.clone_htod(host)?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _slice: slice,
            ptr,
            bytes: host.len(),
        })
    }

    pub fn upload_f32(&self, host: &[f32]) -> Result<DevBuf> {
        let bytes: Vec<u8> = host.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload(&bytes)
    }

    /// Copies `host` to device address `dst` (stream-ordered).
    pub fn write(&self, dst: u64, host: &[u8]) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        // SAFETY: dst points into a live allocation at least host.len() bytes long (callers
        // size their buffers for the largest step).
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, host, self.stream.cu_stream())?;
        }
        Ok(())
    }

    /// Copies device memory at `src` into `out` (plain values: bytes, f32, ints).
    pub fn read<T: Copy>(&self, src: u64, out: &mut [T]) -> Result<()> {
        // SAFETY: src points into a live allocation at least size_of_val(out) bytes long, and
        // every bit pattern is a valid T for the plain value types callers read.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(out, src, self.stream.cu_stream())?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: both ranges lie in live device allocations.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())?
        };
        Ok(())
    }

    /// Page-locked host memory for `n` f32 (cached, not write-combined: the host reads it):
    /// the GPU writes it by DMA at the link's speed, where a pageable destination goes through
    /// the driver's staging copies.
    pub fn pinned_f32(&self, n: usize) -> Result<cudarc::driver::PinnedHostSlice<f32>> {
        // SAFETY: the memory is written by a copy before anything reads it (the callers read
        // only what a download filled).
        Ok(unsafe { self.ctx.alloc_pinned_with_flags::<f32>(n.max(1), 0)? })
    }

    /// Copies `n` f32 from device address `src` into the start of `dst` and waits for them.
    pub fn read_pinned(
        &self,
        src: u64,
        dst: &mut cudarc::driver::PinnedHostSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let out = dst.as_mut_slice()?;
        if n > out.len() {
            return Err(CudaError::Other(format!(
                "a download of {n} floats into a pinned buffer of {}",
                out.len()
            )));
        }
        // SAFETY: src holds at least n floats (the caller's buffer), out[..n] is host memory.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut out[..n], src, self.stream.cu_stream())?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    pub fn read_f32(&self, src: u64, n: usize) -> Result<Vec<f32>> {
        let mut v = vec![0f32; n];
        self.read(src, &mut v)?;
        Ok(v)
    }

    /// `C[n, m] (+)= A[m, k] · B[n, k]ᵀ` in row-major terms: weights A (f16 rows), activations
    /// B (f16 rows), output C f32 (beta 1 adds into C). cuBLAS is column-major, so this is
    /// `C' = A'ᵀ B'` on the same bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_f16(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        b: u64,
        c: u64,
        ldc: usize,
        beta: f32,
    ) -> Result<()> {
        self.gemm(bsys::cudaDataType::CUDA_R_16F, m, n, k, a, b, c, ldc, beta)
    }

    /// As [`Gpu::gemm_f16`] with f32 operands (F32 weights: tiny models, exact checks).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_f32(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        b: u64,
        c: u64,
        ldc: usize,
        beta: f32,
    ) -> Result<()> {
        self.gemm(bsys::cudaDataType::CUDA_R_32F, m, n, k, a, b, c, ldc, beta)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        ty: bsys::cudaDataType,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        b: u64,
        c: u64,
        ldc: usize,
        beta: f32,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, beta);
        // SAFETY: the pointers address device buffers of the stated shapes.
        unsafe {
            blas_ok(
                bsys::cublasGemmEx(
                    self.blas,
                    bsys::cublasOperation_t::CUBLAS_OP_T,
                    bsys::cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    n as i32,
                    k as i32,
                    &alpha as *const f32 as *const _,
                    a as *const _,
                    ty,
                    k as i32,
                    b as *const _,
                    ty,
                    k as i32,
                    &beta as *const f32 as *const _,
                    c as *mut _,
                    bsys::cudaDataType::CUDA_R_32F,
                    ldc as i32,
                    bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                ),
                "gemm",
            )
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the handle was created in `open` and is destroyed once.
        unsafe {
            bsys::cublasDestroy_v2(self.blas);
        }
    }
}

fn blas_ok(s: bsys::cublasStatus_t, what: &str) -> Result<()> {
    if s == bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Blas(format!("{what}: {s:?}")))
    }
}
