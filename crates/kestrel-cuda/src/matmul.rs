//! Matrix products of the CUDA backend: mat-vec kernels for steps of up to [`MATVEC_MAX`]
//! tokens (int8 activations for the quantized types, one launch for up to [`MVX_MATS`] matrices
//! sharing an input: attention's q/k/v, a DeltaNet layer's qkv/z/alpha/beta); the tensor-core
//! mat-mat for quantized weights from [`crate::mmq::MMQ_MIN`] to [`crate::ops::MMQ_MAX`]
//! tokens (batched decode; its kernels and shapes in [`crate::mmq`]); above that, weights
//! dequantized to f16 in row chunks and multiplied by cuBLAS.

use crate::error::{CudaError, Result};
use crate::mmq::{mmq_kernel, takes_mmq, MmqInput, MmqMat, SplitBufs, MMQ_GROUP};
use crate::model::CudaModel;
use crate::ops::{cfg, MATVEC_MAX, MMQ_MAX};
use cudarc::driver::PushKernelArg;
use kestrel_models::backend::{Buf, W};

/// Most matrices one fused mat-vec launch takes (the `mvx_*` kernels' arguments).
pub const MVX_MATS: usize = 4;

/// Warps that share one row of the mat-vec: long rows get more loads in flight (units of 64
/// weights for the K-quants, 32 for the others, 8 for f16/f32; a lane takes one at a time).
pub fn warps_per_row(kind: crate::weights::Kind, cols: usize) -> usize {
    use crate::weights::Kind;
    if matches!(kind, Kind::F32 | Kind::F16) {
        return if cols >= 4096 { 4 } else { 1 };
    }
    let units = cols / unit_cols(kind);
    if units >= 128 {
        4
    } else if units >= 64 {
        2
    } else {
        1
    }
}

/// Columns of a quantized kind's unit (what a lane takes at a time in `kernels/matvec.cu`): 64
/// weights for the K-quants, 32 for the others.
pub(crate) fn unit_cols(kind: crate::weights::Kind) -> usize {
    if kind.k_quant() {
        64
    } else {
        32
    }
}

/// Warps a one-token mat-vec should keep busy: 16 per SM of the H200's 132.
const ROW_GROUP_WARPS: usize = 2048;

/// Rows per warp of a one-token mat-vec over int8 activations: 2 where that still leaves
/// [`ROW_GROUP_WARPS`] warps (and divides `rows` where `exact`), else 1. Measured on the H200
/// (`kestrel gpu-check --perf`, the 8B's four decode shapes, Q4_K and Q6_K): two rows per warp
/// were the fastest or within 8% of it on every shape, up to 25% faster than a row shared by
/// 1-4 warps; four rows per warp were 5-15% slower again (docs/cuda.md).
pub fn rows_per_warp(rows: usize, exact: bool) -> usize {
    if rows / 2 >= ROW_GROUP_WARPS && (!exact || rows.is_multiple_of(2)) {
        2
    } else {
        1
    }
}

/// Warps per row of a one-token mat-vec with fewer than [`ROW_GROUP_WARPS`] rows (the down
/// projections of 1024-1536-wide models): long rows shared by 2 or 4 warps until that many
/// warps run, each keeping at least one unit per lane; 1 otherwise (row groups), and with
/// `KESTREL_CUDA_FEWROWS=0` (A/B figures). H200 (`gpu-check --perf`, 2026-12-03): 1536x8960
/// Q6_K 9.3 -> 7.9 us, Q4_K 7.0 -> 6.3; 1024x3584 Q6_K 4.8 -> 3.7, Q4_K 4.3 -> 3.5.
pub fn few_rows_wpr(kind: crate::weights::Kind, rows: usize, cols: usize) -> usize {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !crate::ops::switch_on(&ON, "KESTREL_CUDA_FEWROWS") {
        return 1;
    }
    let units = cols / unit_cols(kind);
    let mut w = 1;
    while w < 4 && rows * w < ROW_GROUP_WARPS && units >= 32 * w {
        w *= 2;
    }
    w
}

/// Whether a one-token mat-vec over `cols` columns of `kind` should give each row a half-warp:
/// rows of at most 16 units (1024 columns of a K-quant, 512 of the others) leave half of a
/// warp's lanes idle otherwise.
pub fn short_rows(kind: crate::weights::Kind, cols: usize) -> bool {
    kind.int8_activations() && cols / unit_cols(kind) <= 16
}

/// Whether a one-token row of `cols` columns takes a warp of its own (`mv_*_1_<epi>_1`, 64
/// registers, 8 blocks an SM) rather than the row kernels' two rows a warp (128 registers, 4
/// blocks): rows of 17-31 units (the 1.5B's 1,536 columns: 24) are one round of the warp's
/// lanes, so two rows a warp give each lane one unit of each and the warps no more loads in
/// flight than twice as many warps would. H100 `gpu-check --perf`, the 1.5B's head (151,936 x
/// 1,536 Q6_K): 64.9 us against 69.8. Opt-in (`KESTREL_CUDA_ONEROUND=1`) until the model is
/// timed with it: the warps-per-row kernel has no L2 prefetch before its wait, so the 1.5B's
/// one-wave o projection could lose what the head gains (docs/cuda.md, thirty-third session).
pub fn one_round(kind: crate::weights::Kind, cols: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    one_round_rows(kind, cols)
        && *ON.get_or_init(|| std::env::var("KESTREL_CUDA_ONEROUND").is_ok_and(|v| v == "1"))
}

/// Rows that are one round of a warp's lanes: 17-31 K-quant units.
fn one_round_rows(kind: crate::weights::Kind, cols: usize) -> bool {
    kind.k_quant() && (17..32).contains(&(cols / unit_cols(kind)))
}

/// Rows per half-warp of the short-row kernels (`mv_*_h<R>`, `mvx_1_h<R>`): 2 where that still
/// leaves [`ROW_GROUP_WARPS`] warps (and divides `rows` where `exact`), else 1.
pub fn half_rows_per_warp(rows: usize, exact: bool) -> usize {
    if rows / 4 >= ROW_GROUP_WARPS && (!exact || rows.is_multiple_of(4)) {
        2
    } else {
        1
    }
}

/// Bytes up to which an F32 / F16 matrix takes the mat-vec kernels, [`MATVEC_MAX`] tokens a
/// launch, in steps of up to [`MMQ_MAX`] tokens instead of a cuBLAS GEMM (a mixture's router:
/// 1 MiB for Qwen3-30B-A3B; the tiny fixtures' matrices): reading it again every 8 tokens
/// costs less than a GEMM's launch, and a batched decode step without cuBLAS calls can be a
/// graph.
const FLOAT_MAT_VEC_BYTES: usize = 8 << 20;

/// Whether a step of `t` tokens takes the float matrix `m` through the mat-vec kernels.
pub(crate) fn float_mat_vecs(m: &crate::weights::DevMatrix, t: usize) -> bool {
    !m.kind.int8_activations() && m.bytes() <= FLOAT_MAT_VEC_BYTES && t <= MMQ_MAX
}

/// The mat-vec kernel for `nt` tokens over a `rows x cols` matrix of `kind` with epilogue
/// `epi` (0 store, 1 add, 2 SwiGLU), and its grid of 128-thread blocks. The fused SwiGLU reads
/// two matrices per row already: it stays on warps per row (the 8B's gate/up, two distinct
/// matrices: 19.5 us there against 19.8 / 20.3 in rows of one / two a warp, `gpu-check --perf`,
/// H200, 2026-12-04).
pub fn matvec_kernel(
    kind: crate::weights::Kind,
    rows: usize,
    cols: usize,
    nt: usize,
    epi: u32,
) -> (String, u32) {
    if nt == 1 && short_rows(kind, cols) {
        let r = half_rows_per_warp(rows, false);
        return (
            format!("mv_{}_1_{epi}_h{r}", kind.name()),
            rows.div_ceil(4 * 2 * r) as u32,
        );
    }
    if nt == 1 && kind.int8_activations() && epi != 2 {
        let w = few_rows_wpr(kind, rows, cols);
        if w > 1 {
            return (
                format!("mv_{}_1_{epi}_{w}", kind.name()),
                rows.div_ceil(4 / w) as u32,
            );
        }
        if one_round(kind, cols) {
            return (
                format!("mv_{}_1_{epi}_1", kind.name()),
                rows.div_ceil(4) as u32,
            );
        }
        let r = rows_per_warp(rows, false);
        return (
            format!("mv_{}_1_{epi}_r{r}", kind.name()),
            rows.div_ceil(4 * r) as u32,
        );
    }
    let wpr = warps_per_row(kind, cols);
    (
        format!("mv_{}_{nt}_{epi}_{wpr}", kind.name()),
        rows.div_ceil(4 / wpr) as u32,
    )
}
impl CudaModel {
    /// Runs the deferred matmuls over one input: one fused mat-vec launch for two to four, or
    /// one mat-mat launch for each weight type among them.
    pub(crate) fn flush_mm(&mut self) -> Result<()> {
        let pend = std::mem::take(&mut self.step.mm);
        let Some(x) = self.step.mm_x.take() else {
            return Ok(());
        };
        // a deferred norm makes the input of what waits here
        self.flush_norm()?;
        let t = self.rows(x);
        let mmq = |m: &Self, w: W| m.matrix(w).is_ok_and(|m| takes_mmq(m.kind, t));
        if t > MATVEC_MAX || pend.iter().any(|&(w, _)| mmq(self, w)) {
            // mat-mats, one launch per weight type: deferral (ops.rs `matmul`) keeps the entries
            // all int8 here, past the mat-vecs only types the mat-mat takes
            let mut rest = pend;
            while let Some(&(w0, _)) = rest.first() {
                let (kind, cols) = {
                    let m = self.matrix(w0)?;
                    (m.kind, m.cols)
                };
                if !takes_mmq(kind, t) {
                    return Err(CudaError::Other(format!(
                        "a deferred {kind:?} matmul of {t} tokens, which the mat-mat does not take"
                    )));
                }
                let (group, others): (Vec<_>, Vec<_>) = rest
                    .iter()
                    .partition(|&&(w, _)| self.matrix(w).is_ok_and(|m| m.kind == kind));
                for chunk in group.chunks(MMQ_GROUP) {
                    let mats = chunk
                        .iter()
                        .map(|&(w, out)| -> Result<MmqMat> {
                            Ok(MmqMat {
                                w: self.matrix(w)?.buf.ptr,
                                rows: self.matrix(w)?.rows,
                                out: self.buf(out).0,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    self.mmq_group(kind, cols, &mats, x, false)?;
                    for &(_, out) in chunk {
                        self.wrote(out);
                    }
                }
                rest = others;
            }
            return Ok(());
        }
        if pend.len() == 1 {
            let (w, out) = pend[0];
            let (op, _) = self.buf(out);
            self.mm_into(w, None, x, op, false)?;
            self.wrote(out);
            return Ok(());
        }
        let mats: Vec<(u64, i32, i32, u64)> = pend
            .iter()
            .map(|&(w, out)| -> Result<_> {
                let m = self.matrix(w)?;
                Ok((m.buf.ptr, m.rows as i32, m.kind as i32, self.buf(out).0))
            })
            .collect::<Result<_>>()?;
        if pend
            .iter()
            .any(|&(w, _)| self.matrix(w).is_ok_and(|m| m.kind.int8_activations()))
        {
            self.quantize(x)?;
        }
        let rows = self.rows(x);
        let (xp, cols) = self.buf(x);
        let nt = rows.next_power_of_two();
        // one token over quantized matrices: row groups when every matrix's rows divide
        let total_rows: usize = mats.iter().map(|m| m.1 as usize).sum();
        let all_int8 = pend
            .iter()
            .all(|&(w, _)| self.matrix(w).is_ok_and(|m| m.kind.int8_activations()));
        let short = pend
            .iter()
            .all(|&(w, _)| self.matrix(w).is_ok_and(|m| short_rows(m.kind, m.cols)));
        let even = |k: i32| mats.iter().all(|m| m.1 % k == 0);
        // (kernel, rows per warp)
        // the kernels with every type's branch where a matrix needs one (kernels/matvec.cu's mvx)
        let all = if pend
            .iter()
            .any(|&(w, _)| self.matrix(w).is_ok_and(|m| m.kind.fused_all_only()))
        {
            "_all"
        } else {
            ""
        };
        let (name, r) = if nt == 1 && all_int8 && short && even(2) {
            // short rows: each half-warp takes rows; a matrix's rows pair up (or quadruple)
            let h = if even(4) {
                half_rows_per_warp(total_rows, true)
            } else {
                1
            };
            (format!("mvx_1_h{h}{all}"), 2 * h)
        } else if nt == 1 && all_int8 && even(2) {
            match rows_per_warp(total_rows, true) {
                1 => (format!("mvx_{nt}{all}"), 1),
                r => (format!("mvx_1_r{r}{all}"), r),
            }
        } else {
            (format!("mvx_{nt}{all}"), 1)
        };
        let f = self.gpu.func(&name)?;
        let none = (0u64, 0i32, 0i32, 0u64);
        let m = |i: usize| mats.get(i).copied().unwrap_or(none);
        let (a, b, c, d) = (m(0), m(1), m(2), m(3));
        let (q, qd, ci) = (self.scratch.xq.ptr, self.scratch.xd.ptr, cols as i32);
        let total = (a.1 + b.1 + c.1 + d.1) as usize;
        // SAFETY: as in flush_epilogue.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&a.0)
                .arg(&a.1)
                .arg(&a.2)
                .arg(&a.3)
                .arg(&b.0)
                .arg(&b.1)
                .arg(&b.2)
                .arg(&b.3)
                .arg(&c.0)
                .arg(&c.1)
                .arg(&c.2)
                .arg(&c.3)
                .arg(&d.0)
                .arg(&d.1)
                .arg(&d.2)
                .arg(&d.3)
                .arg(&ci)
                .arg(&q)
                .arg(&qd)
                .arg(&xp)
                .launch(cfg((total.div_ceil(4 * r) as u32, 1, 1), 128))?;
        }
        for (_, out) in pend {
            self.wrote(out);
        }
        Ok(())
    }

    /// Makes the 8-bit copy of `x` current.
    pub(crate) fn quantize(&mut self, x: Buf) -> Result<()> {
        if self.step.norm.is_some_and(|n| n.out == x) {
            self.flush_norm()?;
        }
        if self.step.q8_of == Some(x) {
            return Ok(());
        }
        let (ptr, n) = self.buf(x);
        let (q, qd, rows) = (self.scratch.xq.ptr, self.scratch.xd.ptr, self.rows(x));
        quantize_rows(&mut self.gpu, ptr, q, qd, rows, n)?;
        self.step.q8_of = Some(x);
        Ok(())
    }

    /// Makes the f16 copy of `x` current (the GEMM path).
    pub(crate) fn f16_copy(&mut self, x: Buf) -> Result<()> {
        if self.step.f16_of == Some(x) {
            return Ok(());
        }
        let (ptr, n) = self.buf(x);
        let total = (self.rows(x) * n) as u64;
        let f = self.gpu.func("to_f16")?;
        let out = self.scratch.act16.ptr;
        // SAFETY: as in flush.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&ptr)
                .arg(&out)
                .arg(&total)
                .launch(cfg((total.div_ceil(256) as u32, 1, 1), 256))?;
        }
        self.step.f16_of = Some(x);
        Ok(())
    }

    /// `out (+)= w · x`, or with `up`: `out = silu(w · x) * (up · x)`.
    pub(crate) fn mm(&mut self, w: W, up: Option<W>, x: Buf, out: Buf, add: bool) -> Result<()> {
        self.flush()?;
        let rows = self.rows(x);
        let (_, xn) = self.buf(x);
        let (op, on) = self.buf(out);
        let (kind, wrows, wcols) = {
            let m = self.matrix(w)?;
            (m.kind, m.rows, m.cols)
        };
        if wcols != xn || wrows != on {
            return Err(CudaError::Other(format!(
                "{w:?}: [{wrows}, {wcols}] against rows of {xn} -> {on}"
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        match up {
            Some(u) if self.matrix(u)?.kind == kind && takes_mmq(kind, rows) => {
                // gate into out and up into the spare buffer in one mat-mat grid, then SwiGLU
                let spare = self.scratch.up.ptr;
                let mats = [(w, op), (u, spare)].map(|(w, out)| {
                    self.matrix(w).map(|m| MmqMat {
                        w: m.buf.ptr,
                        rows: m.rows,
                        out,
                    })
                });
                let [g, u] = mats;
                self.mmq_group(kind, wcols, &[g?, u?], x, false)?;
                self.swiglu(op, spare, (rows * wrows) as u64)?;
            }
            Some(u)
                if self.matrix(u)?.kind != kind || rows > MATVEC_MAX || takes_mmq(kind, rows) =>
            {
                // two products (gate into out, up into the spare buffer), then SwiGLU
                let spare = self.scratch.up.ptr;
                self.mm_into(w, None, x, op, false)?;
                self.mm_into(u, None, x, spare, false)?;
                self.swiglu(op, spare, (rows * wrows) as u64)?;
            }
            _ => self.mm_into(w, up, x, op, add)?,
        }
        self.wrote(out);
        Ok(())
    }

    /// One product into device address `op` (rows of `w.rows`); `up` (same type as `w`, at most
    /// MATVEC_MAX rows) makes it the fused SwiGLU.
    pub(crate) fn mm_into(
        &mut self,
        w: W,
        up: Option<W>,
        x: Buf,
        op: u64,
        add: bool,
    ) -> Result<()> {
        let rows = self.rows(x);
        let (xp, _) = self.buf(x);
        let (kind, wrows, wcols, wp, chunks) = {
            let m = self.matrix(w)?;
            (m.kind, m.rows, m.cols, m.buf.ptr, float_mat_vecs(m, rows))
        };
        if takes_mmq(kind, rows) {
            return self.mmq(w, x, op, add);
        }
        if rows > MATVEC_MAX && !chunks {
            return self.gemm(w, x, op, add);
        }
        let up_ptr = match up {
            Some(u) => self.matrix(u)?.buf.ptr,
            None => 0,
        };
        if kind.int8_activations() {
            self.quantize(x)?;
        }
        let epi = if up.is_some() { 2 } else { add as u32 };
        let (q, qd) = (self.scratch.xq.ptr, self.scratch.xd.ptr);
        let (r, c, ld, old) = (wrows as i32, wcols as i32, wcols as i32, wrows as i32);
        // MATVEC_MAX tokens a launch (more only for small float matrices, which read the f32
        // rows: the int8 copy is never offset); a launch of nt tokens past the step's last one
        // writes rows of `out` beyond it, which the buffers hold (max_batch rows) and no one reads
        let mut t0 = 0;
        while t0 < rows {
            let n = (rows - t0).min(MATVEC_MAX);
            let (name, grid) = matvec_kernel(kind, wrows, wcols, n.next_power_of_two(), epi);
            let f = self.gpu.func(&name)?;
            let (xt, ot) = (xp + (t0 * wcols * 4) as u64, op + (t0 * wrows * 4) as u64);
            // SAFETY: as in flush.
            unsafe {
                self.gpu
                    .stream
                    .launch_builder(&f)
                    .arg(&wp)
                    .arg(&up_ptr)
                    .arg(&r)
                    .arg(&c)
                    .arg(&q)
                    .arg(&qd)
                    .arg(&ld)
                    .arg(&xt)
                    .arg(&ot)
                    .arg(&old)
                    .launch(cfg((grid, 1, 1), 128))?;
            }
            t0 += n;
        }
        Ok(())
    }

    /// `out (+)= w · x` on the mat-mat (quantized `w`, at most [`crate::ops::MMQ_MAX`] tokens).
    fn mmq(&mut self, w: W, x: Buf, out: u64, add: bool) -> Result<()> {
        let m = self.matrix(w)?;
        let mat = MmqMat {
            w: m.buf.ptr,
            rows: m.rows,
            out,
        };
        self.mmq_group(m.kind, m.cols, &[mat], x, add)
    }

    /// One mat-mat launch over `mats` (of `kind`, `cols` columns), the block shape picked for
    /// their rows together.
    fn mmq_group(
        &mut self,
        kind: crate::weights::Kind,
        cols: usize,
        mats: &[MmqMat],
        x: Buf,
        add: bool,
    ) -> Result<()> {
        let t = self.rows(x);
        let rows = mats.iter().map(|m| m.rows).sum();
        let launch = mmq_kernel(kind, rows, cols, t, add as u32);
        let input = if launch.f16 {
            self.f16_copy(x)?;
            MmqInput::F16 {
                x: self.scratch.act16.ptr,
                splits: SplitBufs {
                    part: self.scratch.mmq_part.ptr,
                    count: self.scratch.mmq_count.ptr,
                },
            }
        } else {
            self.quantize_t(x, launch.t8)?;
            MmqInput::Int8 {
                q: self.scratch.xqt.ptr,
                d: self.scratch.xdt.ptr,
            }
        };
        launch.launch(&mut self.gpu, mats, cols, input, t)
    }

    /// Makes the mat-mat's 8-bit copy of `x` (its own layout, `t8` tokens: `kernels/mmq.cu`)
    /// current.
    fn quantize_t(&mut self, x: Buf, t8: usize) -> Result<()> {
        if self.step.q8t_of == Some(x) {
            return Ok(());
        }
        let (ptr, n) = self.buf(x);
        let f = self.gpu.func("quantize_q_t")?;
        let (q, qd) = (self.scratch.xqt.ptr, self.scratch.xdt.ptr);
        let (ni, ti, t8i) = (n as i32, self.rows(x) as i32, t8 as i32);
        // SAFETY: as in flush; the copy is sized for MMQ_MAX tokens (t8 <= MMQ_MAX).
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&ptr)
                .arg(&q)
                .arg(&qd)
                .arg(&ni)
                .arg(&ti)
                .arg(&t8i)
                .launch(cfg((t8 as u32, n.div_ceil(256) as u32, 1), 256))?;
        }
        self.step.q8t_of = Some(x);
        Ok(())
    }

    pub(crate) fn swiglu(&mut self, gate: u64, up: u64, total: u64) -> Result<()> {
        swiglu(&mut self.gpu, gate, up, total)
    }

    /// Dequantize `w` to f16 in row chunks and multiply on the tensor cores (cuBLAS).
    pub(crate) fn gemm(&mut self, w: W, x: Buf, out: u64, add: bool) -> Result<()> {
        let rows = self.rows(x);
        let (kind, wrows, wcols, wp) = {
            let m = self.matrix(w)?;
            (m.kind, m.rows, m.cols, m.buf.ptr)
        };
        let beta = if add { 1.0 } else { 0.0 };
        if kind == crate::weights::Kind::F32 {
            // f32 weights multiply as they are, in f32
            let (xp, _) = self.buf(x);
            return self
                .gpu
                .gemm_f32(wrows, rows, wcols, wp, xp, out, wrows, beta);
        }
        self.f16_copy(x)?;
        let chunk = (self.scratch.wf16_elems / wcols).clamp(1, wrows);
        let (wbuf, act) = (self.scratch.wf16.ptr, self.scratch.act16.ptr);
        let mut r0 = 0;
        while r0 < wrows {
            let n = chunk.min(wrows - r0);
            dequant_f16(&mut self.gpu, kind, wp, wrows, wcols, r0, n, wbuf)?;
            self.gpu.gemm_f16(
                n,
                rows,
                wcols,
                wbuf,
                act,
                out + (r0 * 4) as u64,
                wrows,
                beta,
            )?;
            r0 += n;
        }
        Ok(())
    }
}

/// gate[i] = silu(gate[i]) * up[i] for `total` floats, enqueued.
pub(crate) fn swiglu(gpu: &mut crate::device::Gpu, gate: u64, up: u64, total: u64) -> Result<()> {
    let f = gpu.func("swiglu")?;
    // SAFETY: gate and up hold `total` floats each.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&gate)
            .arg(&up)
            .arg(&total)
            .launch(cfg((total.div_ceil(256) as u32, 1, 1), 256))?;
    }
    Ok(())
}

/// The 8-bit blocks (`kernels/common.cuh`'s `quant32`) of `rows` activation rows of `cols`
/// floats at `x` into `q` (`rows * cols` bytes) / `qd` (`rows * cols / 32` (d, d * sum) pairs),
/// enqueued.
pub(crate) fn quantize_rows(
    gpu: &mut crate::device::Gpu,
    x: u64,
    q: u64,
    qd: u64,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let f = gpu.func("quantize_q")?;
    let n = cols as i32;
    // SAFETY: the caller sized x, q and qd for rows x cols; the arguments match the kernel.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&x)
            .arg(&q)
            .arg(&qd)
            .arg(&n)
            .launch(cfg((rows as u32, cols.div_ceil(256) as u32, 1), 256))?;
    }
    Ok(())
}

/// Rows `r0 .. r0 + n` of a `rows x cols` matrix of `kind` at `w` (device layout) as f16 at
/// `out`, enqueued: eight weights per thread where rows split into 8-wide runs (every quantized
/// type), else one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dequant_f16(
    gpu: &mut crate::device::Gpu,
    kind: crate::weights::Kind,
    w: u64,
    rows: usize,
    cols: usize,
    r0: usize,
    n: usize,
    out: u64,
) -> Result<()> {
    let wide = cols.is_multiple_of(8);
    let f = gpu.func(if wide {
        "dequant_f16_x8"
    } else {
        "dequant_f16"
    })?;
    let total = (n * cols / if wide { 8 } else { 1 }) as u64;
    let (ty, r, c, r0, n) = (kind as i32, rows as i32, cols as i32, r0 as i32, n as i32);
    // SAFETY: w holds rows x cols of `kind`, out n x cols f16.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&ty)
            .arg(&w)
            .arg(&r)
            .arg(&c)
            .arg(&r0)
            .arg(&n)
            .arg(&out)
            .launch(cfg((total.div_ceil(256) as u32, 1, 1), 256))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Kind;

    #[test]
    fn one_token_picks_by_row_length() {
        // off by default (KESTREL_CUDA_ONEROUND=1 opts in): 24-unit rows on the row kernels
        if std::env::var("KESTREL_CUDA_ONEROUND").is_err() {
            assert!(!one_round(Kind::Q6K, 1536));
            assert_eq!(
                matvec_kernel(Kind::Q6K, 151_936, 1536, 1, 0).0,
                "mv_q6_k_1_0_r2"
            );
            assert_eq!(
                matvec_kernel(Kind::Q4K, 1536, 1536, 1, 1),
                ("mv_q4_k_1_1_r1".into(), 384)
            );
        }
        // 16 units: half-warps; 64: two rows a warp; the SwiGLU keeps warps per row
        assert_eq!(
            matvec_kernel(Kind::Q4K, 65_536, 1024, 1, 0).0,
            "mv_q4_k_1_0_h2"
        );
        assert_eq!(
            matvec_kernel(Kind::Q4K, 6144, 4096, 1, 0).0,
            "mv_q4_k_1_0_r2"
        );
        assert_eq!(
            matvec_kernel(Kind::Q4K, 8960, 1536, 1, 2).0,
            "mv_q4_k_1_2_1"
        );
        // the rows one_round takes: the 1.5B's 1,536 columns of a K-quant (24 units), not
        // 1,024 (16: half-warps) or 2,048 (32), nor Q8_0's 48 units of 32 columns
        assert!(one_round_rows(Kind::Q6K, 1536) && one_round_rows(Kind::Q4K, 1984));
        assert!(!one_round_rows(Kind::Q4K, 1024) && !one_round_rows(Kind::Q4K, 2048));
        assert!(!one_round_rows(Kind::Q8_0, 1536));
    }
}
