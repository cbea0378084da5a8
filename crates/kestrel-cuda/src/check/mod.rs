//! One harness for the backend's operations: every kernel on random inputs of real shapes
//! against the CPU reference (kestrel-quant's dequantization, kestrel-models' ops, plain f64
//! loops), each with its stated tolerance on ‖gpu − cpu‖ / ‖cpu‖; and a perf line per mat-vec
//! type (GB/s of weights against the bandwidth). `kestrel gpu-check` runs it on a GPU host;
//! the tests at the bottom run it when a GPU is present and say they skipped otherwise.

use crate::device::Gpu;

mod attention;
mod deltanet;
mod matvec;
mod mmq;
mod moe;
mod rows;
use crate::error::{CudaError, Result};
pub(super) use crate::matmul::quantize_rows;
use crate::weights::Kind;
pub use attention::{check_attention, check_flash, perf_decode, perf_flash};
use cudarc::driver::LaunchConfig;
pub use deltanet::{check_deltanet, perf_delta_rule};
pub use matvec::{check_matvec, check_mvx, check_qkv_rope, perf_matvec};
pub use mmq::{check_mmq, check_mmq_group, perf_mmq};
pub use moe::{check_moe, perf_moe};
pub use rows::{check_argmax, check_epilogue, check_gemm_embed, check_norm};

/// A small xorshift generator: inputs differ per case, and a case can be rerun from its seed.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// The logits download of a decode step of 32 sequences over a 248,320-token vocabulary (the
/// Qwen3.5 models'), three ways: into pageable memory (a `Vec`), into page-locked memory, and
/// page-locked then copied into a `Vec`. (label, ms, GB/s), best of 5.
pub fn perf_download(gpu: &Gpu) -> Result<Vec<(String, f64, f64)>> {
    let n = 32 * 248_320;
    let dev = gpu.upload_f32(&vec![0.5f32; n])?;
    let mut pageable = vec![0f32; n];
    let mut pinned = gpu.pinned_f32(n)?;
    let mut res = Vec::new();
    let mb = (n * 4) as f64 / 1e6;
    for way in ["pageable Vec", "pinned", "pinned + copy into a Vec"] {
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            match way {
                "pageable Vec" => gpu.read(dev.ptr, &mut pageable)?,
                _ => {
                    gpu.read_pinned(dev.ptr, &mut pinned, n)?;
                    if way != "pinned" {
                        pageable.copy_from_slice(pinned.as_slice()?);
                    }
                }
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
        res.push((format!("{mb:.1} MB logits, {way}"), best, mb / best));
    }
    if pageable.iter().any(|&x| x != 0.5) {
        return Err(CudaError::Other(
            "the logits download came back wrong".into(),
        ));
    }
    Ok(res)
}

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub op: String,
    pub err: f64,
    pub tol: f64,
}

impl CaseResult {
    pub fn pass(&self) -> bool {
        self.err.is_finite() && self.err <= self.tol
    }
}

/// Microseconds per launch of `launch(gpu, i)` for i in 0..reps, after `warm` plain launches:
/// `graph` replays them from one captured CUDA graph as decode runs (no launch gaps between
/// kernels, programmatic edges where decode has them: the one-token row kernels' L2 prefetches
/// before their `GRID_DEP()` overlap the previous launch's tail; `read_floor` has no
/// `GRID_DEP()`, so its launches do not overlap; `read_rows_*` wait at their start, with no
/// prefetch before it), else they go as plain stream launches.
pub(crate) fn time_us(
    gpu: &mut Gpu,
    warm: usize,
    reps: usize,
    graph: bool,
    mut launch: impl FnMut(&mut Gpu, usize) -> Result<()>,
) -> Result<f64> {
    use cudarc::driver::sys;
    for i in 0..warm {
        launch(&mut *gpu, i)?;
    }
    let g = if graph {
        let stream = gpu.stream.clone();
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let r = (0..reps).try_for_each(|i| launch(&mut *gpu, i));
        let programmatic = crate::graph::programmatic_launch(gpu);
        let g = crate::graph::end_capture(gpu, &gpu.kernel_funcs(), programmatic);
        r?;
        Some(g?)
    } else {
        None
    };
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let e0 = gpu.stream.record_event(timing)?;
    match &g {
        Some(g) => g.launch(gpu)?,
        None => (0..reps).try_for_each(|i| launch(&mut *gpu, i))?,
    }
    let e1 = gpu.stream.record_event(timing)?;
    e1.synchronize()?;
    Ok(e0.elapsed_ms(&e1)? as f64 * 1e3 / reps as f64)
}

/// ‖a − b‖ / ‖b‖ (NaN anywhere fails).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

pub(super) fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A random matrix quantized to `kind`: (file bytes, the f32 values they decode to).
pub fn random_matrix(
    kind: Kind,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> Result<(Vec<u8>, Vec<f32>)> {
    let ty = kind.ggml();
    let rb = kestrel_quant::row_bytes(ty, cols).map_err(|e| CudaError::Other(e.to_string()))?;
    let mut bytes = vec![0u8; rows * rb];
    let mut deq = vec![0f32; rows * cols];
    for r in 0..rows {
        let src = rng.vec(cols, 0.05);
        let dst = &mut bytes[r * rb..(r + 1) * rb];
        kestrel_quant::quantize_row(ty, &src, dst).map_err(|e| CudaError::Other(e.to_string()))?;
        kestrel_quant::dequantize_row(ty, dst, &mut deq[r * cols..(r + 1) * cols])
            .map_err(|e| CudaError::Other(e.to_string()))?;
    }
    Ok((bytes, deq))
}

pub(super) fn f16_rows(gpu: &mut Gpu, x: u64, out: u64, n: usize) -> Result<()> {
    use cudarc::driver::PushKernelArg;
    let f = gpu.func("to_f16")?;
    let n = n as u64;
    // SAFETY: the caller sized x (n f32) and out (n f16); the arguments match the kernel.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&x)
            .arg(&out)
            .arg(&n)
            .launch(cfg((n.div_ceil(256) as u32, 1, 1), 256))?;
    }
    Ok(())
}

/// One launch of a mat-vec kernel (`mv_*` in kernels/matvec.cu): `w` (and `w2`, the SwiGLU's
/// up) of `rows` x `cols`, the 8-bit copy `q` = (quants, scales) and the f32 rows `xf` of the
/// input, `out` rows floats a token.
pub(super) struct MvLaunch {
    pub w: u64,
    pub w2: u64,
    pub rows: usize,
    pub cols: usize,
    pub q: (u64, u64),
    pub xf: u64,
    pub out: u64,
}

impl MvLaunch {
    /// Enqueues kernel `f` over `grid` blocks of 128 threads.
    ///
    /// # Safety
    /// The buffers hold what `f` reads and writes for these shapes and its token count.
    pub(super) unsafe fn run(
        &self,
        gpu: &Gpu,
        f: &cudarc::driver::CudaFunction,
        grid: u32,
    ) -> Result<()> {
        use cudarc::driver::PushKernelArg;
        let (r, c) = (self.rows as i32, self.cols as i32);
        // SAFETY: the caller's.
        unsafe {
            gpu.stream
                .launch_builder(f)
                .arg(&self.w)
                .arg(&self.w2)
                .arg(&r)
                .arg(&c)
                .arg(&self.q.0)
                .arg(&self.q.1)
                .arg(&c)
                .arg(&self.xf)
                .arg(&self.out)
                .arg(&r)
                .launch(cfg((grid, 1, 1), 128))?;
        }
        Ok(())
    }
}

pub(super) fn bytes_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs every case; returns them (the caller prints and decides).
type Check = fn(&mut Gpu, &mut Rng, &mut Vec<CaseResult>) -> Result<()>;

/// The harness's groups of cases, by name, in the order they run.
const GROUPS: &[(&str, Check)] = &[
    ("matvec", check_matvec),
    ("mvx", check_mvx),
    ("mmq", check_mmq),
    ("mmq_group", check_mmq_group),
    ("norm", check_norm),
    ("argmax", check_argmax),
    ("epilogue", check_epilogue),
    ("attention", check_attention),
    ("flash", check_flash),
    ("deltanet", check_deltanet),
    ("gemm_embed", check_gemm_embed),
    ("qkv_rope", check_qkv_rope),
    ("moe", check_moe),
];

/// The groups' names.
pub fn op_groups() -> Vec<&'static str> {
    GROUPS.iter().map(|g| g.0).collect()
}

/// Runs the groups of cases named in `groups` (all when empty); an unknown name is an error
/// that lists the known ones. Each group draws its inputs from its own seed, so a group run
/// alone meets the same cases as in a whole run.
pub fn run_all(gpu: &mut Gpu, seed: u64, groups: &[String]) -> Result<Vec<CaseResult>> {
    if let Some(bad) = groups
        .iter()
        .find(|g| !GROUPS.iter().any(|(name, _)| name == g))
    {
        return Err(CudaError::Other(format!(
            "no op group '{bad}' (groups: {})",
            op_groups().join(", ")
        )));
    }
    gpu.bind()?;
    let mut out = Vec::new();
    for (i, (name, check)) in GROUPS.iter().enumerate() {
        if groups.is_empty() || groups.iter().any(|g| g == name) {
            let mut rng = Rng::new(seed.wrapping_mul(0x100) + i as u64);
            check(gpu, &mut rng, &mut out)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_matches_the_cpu_on_a_gpu() {
        let mut gpu = match Gpu::open(0) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipped: no GPU here ({e})");
                return;
            }
        };
        let results = run_all(&mut gpu, 1, &[]).expect("harness ran");
        let failed: Vec<_> = results.iter().filter(|r| !r.pass()).collect();
        assert!(failed.is_empty(), "{failed:#?}");
    }

    #[test]
    fn rel_err_fails_on_nan() {
        assert!(rel_err(&[f32::NAN], &[1.0]).is_nan());
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    }
}
