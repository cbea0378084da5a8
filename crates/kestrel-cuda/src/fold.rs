//! RMSNorms folded into the one-token mat-vec before them. In a decode step the residual
//! projections (attention's or a DeltaNet layer's output, the MLP's down) are followed by an
//! RMSNorm whose output only quantized mat-vecs read. Such a projection runs as `mvb_*`
//! (`kernels/matvec.cu`): each block owns 32 rows, adds them to the residual, and writes them as
//! the next mat-vec's int8 block of `x * w` (the norm's weights) with the block's sum of squares;
//! the consumers apply the norm's 1 / rms to their sums (`rstd` there). A decode layer then runs
//! two kernels fewer, each a chain of round trips (wait, load the row, reduce, store).
//!
//! The producer's launch waits for the next op to know whether the fold applies: an RMSNorm of
//! its output attaches to it, mat-vecs of the norm's output over quantized weights launch it
//! folded, and anything else launches it and the norm as they were. `KESTREL_CUDA_FOLD=0` turns
//! folding off (A/B figures), `=all` folds matrices of any multiple of 32 rows (the tiny
//! models' checks), the default those of at least [`FOLD_MIN_ROWS`].

use crate::error::{CudaError, Result};
use crate::model::CudaModel;
use crate::ops::cfg;
use cudarc::driver::PushKernelArg;
use kestrel_models::backend::{Buf, W};

/// Rows a folded mat-vec needs by default: 128 blocks of 32 rows, about one a SM of the
/// H200's 132 (fewer blocks leave SMs without a share of the weights).
pub const FOLD_MIN_ROWS: usize = 4096;

/// A one-token residual mat-vec (`x_out += w · x`) whose launch waits for the next op, and the
/// RMSNorm of its output that followed it: (weights, output buffer).
#[derive(Clone, Copy, Debug)]
pub struct Fold {
    pub w: W,
    pub x: Buf,
    pub out: Buf,
    pub norm: Option<(W, Buf)>,
}

/// The folding switch from the environment: `None` off, `Some(min_rows)` on (a model's
/// `fold_min_rows` starts from it).
pub fn fold_min_rows() -> Option<usize> {
    static MODE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("KESTREL_CUDA_FOLD").as_deref() {
        Ok("0") => None,
        Ok("all") => Some(32),
        _ => Some(FOLD_MIN_ROWS),
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

    /// Whether `out += w · x` may wait as a fold's producer (see the module's comment).
    pub(crate) fn fold_producer(&self, w: W, x: Buf) -> bool {
        let Some(min_rows) = self.fold_min_rows else {
            return false;
        };
        self.rows(x) == 1
            && self.matrix(w).is_ok_and(|m| {
                m.kind.int8_activations() && m.rows >= min_rows && m.rows.is_multiple_of(32)
            })
    }

    /// Attaches `out = rms_norm(x) * w` to the waiting producer of `x`; false where it does
    /// not apply (the caller runs the norm).
    pub(crate) fn fold_norm(&mut self, x: Buf, w: W, out: Buf) -> bool {
        match &mut self.step.fold {
            Some(f) if f.out == x && f.norm.is_none() && x != out => {
                f.norm = Some((w, out));
                true
            }
            _ => false,
        }
    }

    /// Launches the waiting producer, if any: folded when `readers` are mat-vecs of its norm's
    /// output `x` over quantized weights (one token), else as it was and then its norm.
    pub(crate) fn resolve_fold(&mut self, x: Option<Buf>, readers: &[W]) -> Result<()> {
        let Some(f) = self.step.fold.take() else {
            return Ok(());
        };
        let folded = match f.norm {
            Some((_, h)) => {
                x == Some(h)
                    && !readers.is_empty()
                    && readers
                        .iter()
                        .all(|&w| self.matrix(w).is_ok_and(|m| m.kind.int8_activations()))
            }
            None => false,
        };
        match f.norm {
            Some((g, h)) if folded => self.launch_folded(f.w, f.x, f.out, g, h)?,
            norm => {
                let (op, _) = self.buf(f.out);
                self.mm_into(f.w, None, f.x, op, true)?;
                self.wrote(f.out);
                if let Some((g, h)) = norm {
                    self.norm_kernel(f.out, g, h)?;
                }
            }
        }
        Ok(())
    }

    /// `out += w · x` as `mvb_*_1`, writing the int8 block of `rms_norm(out) * g` without its
    /// 1 / rms (and the sums of squares) into the 8-bit copy that `x`'s is not, as `h`'s.
    fn launch_folded(&mut self, w: W, x: Buf, out: Buf, g: W, h: Buf) -> Result<()> {
        self.quantize(x)?;
        let (op, _) = self.buf(out);
        let (q, qd, xs) = self.q8_ptrs();
        let slot = 1 - self.step.q8_slot;
        let (oq, oqd, oss) = self.q8_slot_ptrs(slot);
        let (kind, rows, cols, wp) = {
            let m = self.matrix(w)?;
            (m.kind, m.rows, m.cols, m.buf.ptr)
        };
        if self.buf(h).1 != rows {
            return Err(CudaError::Other(format!(
                "a norm of {} columns folded into a mat-vec of {rows} rows",
                self.buf(h).1
            )));
        }
        let gp = self.vector(g)?;
        let f = self.gpu.func(&format!("mvb_{}_1", kind.name()))?;
        let (r, c, eps, none) = (rows as i32, cols as i32, self.config.rms_eps, 0u64);
        // SAFETY: W holds rows x cols of its type in the device layout (rows a multiple of 32,
        // fold_producer), the copies hold one token of cols (inputs) and rows (outputs), out
        // and g rows floats.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&wp)
                .arg(&none)
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
        self.wrote(out);
        self.wrote(h);
        self.step.q8_of = Some(h);
        self.step.q8_slot = slot;
        self.step.q8_rstd = true;
        self.step.f32_stale = Some(h);
        self.folded_norms += 1;
        Ok(())
    }
}
