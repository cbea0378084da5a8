//! Kernels folded into the one-token mat-vec before them. In a decode step the residual
//! projections (attention's or a DeltaNet layer's output, the MLP's down) are followed by an
//! RMSNorm whose output only quantized mat-vecs read, and the SwiGLU by the quantization of its
//! output for the down projection. Such a mat-vec runs as `mvb_*` (`kernels/matvec.cu`): each
//! block owns 32 rows and writes them as the next mat-vec's int8 block as well: the residual's
//! of `x * w` (the norm's weights) with the block's sum of squares, the consumers applying the
//! norm's 1 / rms to their sums (`rstd` there); the SwiGLU's as they are. A decode layer then
//! runs three kernels fewer, each a chain of round trips (wait, load the row, reduce, store).
//!
//! The producer's launch waits for the next op to know whether the fold applies: an RMSNorm of
//! a residual producer's output attaches to it; quantized mat-vecs of the norm's output (of the
//! SwiGLU's) launch it folded; anything else launches it (and the norm) as they were.
//!
//! Off by default: it did not pay where timed (H100, 2026-12-05: Qwen3-8B tg128 371 with it,
//! 376 with the norms alone, 374 without; Qwen2.5-1.5B 944 / 983 / 994: the norm kernels'
//! latency is already hidden under the programmatic launches, and the 32-row blocks' SwiGLU is
//! slower than its warps-per-row kernel). `KESTREL_CUDA_FOLD=1` folds both kinds
//! over matrices of at least [`FOLD_MIN_ROWS`] rows, `=norm` the norms alone, `=all` matrices
//! of any multiple of 32 rows (the tiny models' checks); `gpu-check` compares decode with and
//! without it on every model whatever the setting.

use crate::error::{CudaError, Result};
use crate::model::CudaModel;
use crate::ops::cfg;
use cudarc::driver::PushKernelArg;
use kestrel_models::backend::{Buf, W};

/// Rows a folded mat-vec needs by default: 128 blocks of 32 rows, about one a SM of the
/// H200's 132 (fewer blocks leave SMs without a share of the weights).
pub const FOLD_MIN_ROWS: usize = 4096;

/// A one-token mat-vec whose launch waits for the next op: a residual one (`out += w · x`)
/// and the RMSNorm of its output that followed it (weights, output buffer), or the SwiGLU
/// (`out = silu(w · x) * (up · x)`).
#[derive(Clone, Copy, Debug)]
pub struct Fold {
    pub w: W,
    pub up: Option<W>,
    pub x: Buf,
    pub out: Buf,
    pub norm: Option<(W, Buf)>,
}

impl Fold {
    /// The buffer whose 8-bit copy the folded launch writes, once it has one.
    pub fn target(&self) -> Option<Buf> {
        match (self.up, self.norm) {
            (Some(_), _) => Some(self.out),
            (None, norm) => norm.map(|(_, h)| h),
        }
    }
}

/// What folds: matrices of at least `min_rows` rows (a multiple of 32), and whether the
/// SwiGLU's quantization folds as well as the norms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FoldMode {
    pub min_rows: usize,
    pub swiglu: bool,
}

/// The folding switch from the environment (a model's `fold` starts from it): None off.
pub fn fold_mode() -> Option<FoldMode> {
    static MODE: std::sync::OnceLock<Option<FoldMode>> = std::sync::OnceLock::new();
    let mode = |min_rows, swiglu| Some(FoldMode { min_rows, swiglu });
    *MODE.get_or_init(|| match std::env::var("KESTREL_CUDA_FOLD").as_deref() {
        Ok("1") => mode(FOLD_MIN_ROWS, true),
        Ok("norm") => mode(FOLD_MIN_ROWS, false),
        Ok("all") => mode(32, true),
        _ => None,
    })
}

impl CudaModel {
    /// Marks the first 8-bit copy (the norm, quantize and attention kernels') as `b`'s.
    pub(crate) fn q8_main(&mut self, b: Buf) {
        self.step.q8_of = Some(b);
        self.step.q8_slot = 0;
        self.step.q8_rstd = false;
    }

    /// (quants, scales, sums of squares) of 8-bit copy `slot`.
    fn q8_slot_ptrs(&self, slot: usize) -> (u64, u64, u64) {
        let s = &self.scratch;
        if slot == 0 {
            (s.xq.ptr, s.xd.ptr, s.xs.ptr)
        } else {
            (s.yq.ptr, s.yd.ptr, s.ys.ptr)
        }
    }

    /// What the mat-vecs read for `q8_of`: (quants, scales, the folded norm's sums of squares
    /// or 0 where no 1 / rms is left to apply).
    pub(crate) fn q8_ptrs(&self) -> (u64, u64, u64) {
        let (q, d, s) = self.q8_slot_ptrs(self.step.q8_slot);
        (q, d, if self.step.q8_rstd { s } else { 0 })
    }

    /// `x`'s f32 rows, for a kernel that reads them; an error where a fold left them unwritten
    /// (only the quantized mat-vecs it was folded for may read that buffer).
    pub(crate) fn f32_input(&self, x: Buf) -> Result<u64> {
        if self.step.f32_stale == Some(x) {
            return Err(CudaError::Other(format!(
                "{x:?} was normalized into the mat-vecs' 8-bit copy only (a folded RMSNorm), \
                 but a kernel reads its f32 rows"
            )));
        }
        Ok(self.buf(x).0)
    }

    /// Whether `out += w · x` (`add`), or the SwiGLU of `w` and `up`, may wait as a fold's
    /// producer (see the module's comment).
    pub(crate) fn fold_producer(&self, w: W, up: Option<W>, x: Buf, add: bool) -> bool {
        let Some(mode) = self.fold else {
            return false;
        };
        let kind = |w: W| self.matrix(w).map(|m| m.kind).ok();
        let role = match up {
            None => add,
            Some(u) => !add && mode.swiglu && kind(u) == kind(w),
        };
        role && self.rows(x) == 1
            && self.matrix(w).is_ok_and(|m| {
                m.kind.int8_activations() && m.rows >= mode.min_rows && m.rows.is_multiple_of(32)
            })
    }

    /// Attaches `out = rms_norm(x) * w` to the waiting producer of `x`; false where it does
    /// not apply (the caller runs the norm).
    pub(crate) fn fold_norm(&mut self, x: Buf, w: W, out: Buf) -> bool {
        match &mut self.step.fold {
            Some(f) if f.up.is_none() && f.out == x && f.norm.is_none() && x != out => {
                f.norm = Some((w, out));
                true
            }
            _ => false,
        }
    }

    /// Launches the waiting producer, if any: folded when `readers` are mat-vecs of its
    /// target `x` (the norm's output, the SwiGLU's) over quantized weights, else as it was
    /// (and then its norm).
    pub(crate) fn resolve_fold(&mut self, x: Option<Buf>, readers: &[W]) -> Result<()> {
        let Some(f) = self.step.fold.take() else {
            return Ok(());
        };
        let folded = f.target().is_some_and(|t| x == Some(t))
            && !readers.is_empty()
            && readers
                .iter()
                .all(|&w| self.matrix(w).is_ok_and(|m| m.kind.int8_activations()));
        if folded {
            return self.launch_folded(f);
        }
        let (op, _) = self.buf(f.out);
        self.mm_into(f.w, f.up, f.x, op, f.up.is_none())?;
        self.wrote(f.out);
        if let Some((g, h)) = f.norm {
            self.norm_kernel(f.out, g, h)?;
        }
        Ok(())
    }

    /// The producer as `mvb_*`, its int8 blocks into the 8-bit copy that its input's is not:
    /// the residual's (epilogue 1) of `rms_norm(out) * g` without the 1 / rms, with the sums of
    /// squares, as the norm output's; the SwiGLU's (2) of its output.
    fn launch_folded(&mut self, f: Fold) -> Result<()> {
        let (kind, rows, cols, wp) = {
            let m = self.matrix(f.w)?;
            (m.kind, m.rows, m.cols, m.buf.ptr)
        };
        let target = f.target().unwrap_or(f.out);
        if self.buf(target).1 != rows {
            return Err(CudaError::Other(format!(
                "{target:?} of {} columns folded into a mat-vec of {rows} rows",
                self.buf(target).1
            )));
        }
        self.quantize(f.x)?;
        let (op, _) = self.buf(f.out);
        let (q, qd, xs) = self.q8_ptrs();
        let slot = 1 - self.step.q8_slot;
        let (oq, oqd, oss) = self.q8_slot_ptrs(slot);
        let (epi, up, gp, oss) = match (f.up, f.norm) {
            (Some(u), _) => (2, self.matrix(u)?.buf.ptr, 0, 0),
            (None, Some((g, _))) => (1, 0, self.vector(g)?, oss),
            (None, None) => {
                return Err(CudaError::Other(
                    "a residual mat-vec folded without its norm".into(),
                ))
            }
        };
        let fs = if xs != 0 { "_f" } else { "" };
        let func = self.gpu.func(&format!("mvb_{}_{epi}{fs}", kind.name()))?;
        let (r, c, eps) = (rows as i32, cols as i32, self.config.rms_eps);
        // SAFETY: W (and up) hold rows x cols of their type in the device layout (rows a
        // multiple of 32, fold_producer), the copies hold one token of cols (inputs) and rows
        // (outputs), out and g rows floats; g and oss are null for the SwiGLU.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&func)
                .arg(&wp)
                .arg(&up)
                .arg(&r)
                .arg(&c)
                .arg(&q)
                .arg(&qd)
                .arg(&xs)
                .arg(&op)
                .arg(&gp)
                .arg(&eps)
                .arg(&oq)
                .arg(&oqd)
                .arg(&oss)
                .launch(cfg(((rows / 32) as u32, 1, 1), 512))?;
        }
        self.wrote(f.out);
        self.wrote(target);
        self.step.q8_of = Some(target);
        self.step.q8_slot = slot;
        self.step.q8_rstd = epi == 1;
        if epi == 1 {
            // the norm's f32 rows are never written: only the readers checked above read them
            self.step.f32_stale = Some(target);
        }
        self.folds += 1;
        Ok(())
    }
}
