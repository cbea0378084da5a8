//! Matrix products of the CUDA backend: mat-vec kernels for steps of up to [`MATVEC_MAX`]
//! tokens (int8 activations for the quantized types, one launch for up to [`MVX_MATS`] matrices
//! sharing an input: attention's q/k/v, a DeltaNet layer's qkv/z/alpha/beta); the int8
//! tensor-core mat-mat (`kernels/mmq.cu`) for quantized weights from [`MMQ_MIN`] to
//! [`MMQ_MAX`] tokens (batched decode); above that, weights dequantized to f16 in row chunks
//! and multiplied by cuBLAS.

use crate::error::{CudaError, Result};
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
fn unit_cols(kind: crate::weights::Kind) -> usize {
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

/// Rows per half-warp of the short-row kernels (`mv_*_h<R>`, `mvx_1_h<R>`): 2 where that still
/// leaves [`ROW_GROUP_WARPS`] warps (and divides `rows` where `exact`), else 1.
pub fn half_rows_per_warp(rows: usize, exact: bool) -> usize {
    if rows / 4 >= ROW_GROUP_WARPS && (!exact || rows.is_multiple_of(4)) {
        2
    } else {
        1
    }
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

/// Matrices one mat-mat launch takes at most (`kernels/mmq.cu`'s `MMQ_MATS_ARGS`, `mmq_pick`): the projections
/// that share an input (q / gate / k / v, a DeltaNet layer's four) in one grid, so the small ones
/// (k and v of 1,024 rows, alpha and beta of 32) do not each leave most SMs idle.
pub const MMQ_GROUP: usize = 4;

/// One matrix of a mat-mat launch: its device weights, rows, and the output (`[t, rows]` f32).
#[derive(Clone, Copy, Debug)]
pub struct MmqMat {
    pub w: u64,
    pub rows: usize,
    pub out: u64,
}

/// One launch of the quantized mat-mat (`kernels/mmq.cu`).
pub struct MmqLaunch {
    pub name: String,
    /// Rows a block takes (16 a row tile).
    pub block_rows: usize,
    /// Blocks along the tokens (tiles of the step).
    pub token_tiles: u32,
    /// Threads a block: 32 per warp splitting the rows' units.
    pub block: u32,
    /// Dynamic shared memory a block (the staged kernels' rings), bytes.
    pub smem: u32,
    /// The step's tokens rounded up to the tile (the padded count of its activation layout).
    pub t8: usize,
    /// The f16 kernel (`kernels/mmh.cu`): it reads the f16 copy of the activations, not the
    /// 8-bit one.
    pub f16: bool,
}

/// The activations a mat-mat launch reads: the 8-bit copy in the mat-mat's layout (quants,
/// scales), or the f16 copy (`[t, cols]`) for the f16 kernels.
#[derive(Clone, Copy, Debug)]
pub enum MmqInput {
    Int8 { q: u64, d: u64 },
    F16(u64),
}

impl MmqLaunch {
    /// The kernel, allowed the dynamic shared memory it takes (above the default 48 KiB).
    pub fn func(&self, gpu: &mut crate::device::Gpu) -> Result<cudarc::driver::CudaFunction> {
        gpu.func_with_smem(&self.name, self.smem)
    }

    /// Enqueues `out_i (+)= W_i · x` for 1 to [`MMQ_GROUP`] matrices of this launch's kind and
    /// `cols` columns (the add epilogue takes one), `x` the copy of `t` tokens this launch
    /// reads (the 8-bit one padded to `self.t8` tokens, or the f16 one).
    pub fn launch(
        &self,
        gpu: &mut crate::device::Gpu,
        mats: &[MmqMat],
        cols: usize,
        x: MmqInput,
        t: usize,
    ) -> Result<()> {
        if mats.is_empty() || mats.len() > MMQ_GROUP {
            return Err(CudaError::Other(format!(
                "a mat-mat launch takes 1 to {MMQ_GROUP} matrices, not {}",
                mats.len()
            )));
        }
        let f = self.func(gpu)?;
        let m: Vec<(u64, i32, u64)> = (0..MMQ_GROUP)
            .map(|i| {
                mats.get(i)
                    .map_or((0, 0, 0), |m| (m.w, m.rows as i32, m.out))
            })
            .collect();
        let blocks: usize = mats.iter().map(|m| m.rows.div_ceil(self.block_rows)).sum();
        let config = cudarc::driver::LaunchConfig {
            shared_mem_bytes: self.smem,
            ..crate::ops::cfg((blocks as u32, self.token_tiles, 1), self.block)
        };
        let (c, t8, ti) = (cols as i32, self.t8 as i32, t as i32);
        let mut b = gpu.stream.launch_builder(&f);
        for (w, r, o) in &m {
            b.arg(w).arg(r).arg(o);
        }
        b.arg(&c);
        let (q, d, f16);
        match (x, self.f16) {
            (MmqInput::Int8 { q: xq, d: xd }, false) => {
                (q, d) = (xq, xd);
                b.arg(&q).arg(&d).arg(&t8);
            }
            (MmqInput::F16(p), true) => {
                f16 = p;
                b.arg(&f16);
            }
            _ => {
                return Err(CudaError::Other(format!(
                    "{}: activations of the other form ({x:?})",
                    self.name
                )))
            }
        }
        b.arg(&ti);
        // SAFETY: each W_i holds rows_i x cols of the kernel's type in the device layout, x holds
        // t tokens of cols (the 8-bit copy: t8, in the mat-mat's layout; the f16 copy: t rows),
        // out_i t rows of rows_i floats; unused entries have 0 rows and are never read.
        unsafe { b.launch(config) }?;
        Ok(())
    }
}

/// The quantized mat-mat for a step of `t` tokens over a `rows` x `cols` matrix with epilogue
/// `epi` (0 store, 1 add): token tiles of 8, 16, 32 or 64 (the smallest that holds the step;
/// longer steps take several tiles of 64), blocks of 16 or 32 rows whose warps split the row
/// ([`mmq_shape`]).
pub fn mmq_kernel(
    kind: crate::weights::Kind,
    rows: usize,
    cols: usize,
    t: usize,
    epi: u32,
) -> MmqLaunch {
    mmq_launch(kind, t, epi, mmq_shape(kind, rows, cols, t))
}

/// A mat-mat block: `warps` warps splitting the units of `tiles` x 16 rows (each warp takes
/// every tile: an activation fragment feeds `tiles` mma); `stages` > 0: the staged kernel
/// (K-quants), each warp streaming its units through a ring of that many stages of shared
/// memory. `f16`: the f16 kernel (Q4_K, Q6_K), whose warps each take their own `tiles` x 16
/// rows over every column (a block of `warps` x `tiles` x 16 rows) and share the block's
/// ring of `stages` stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqShape {
    pub warps: usize,
    pub tiles: usize,
    pub stages: usize,
    pub f16: bool,
}

/// [`mmq_kernel`] in block shape `shape` (one of [`mmq_block_shapes`]).
pub fn mmq_launch(kind: crate::weights::Kind, t: usize, epi: u32, shape: MmqShape) -> MmqLaunch {
    let tile = mmq_tile(t);
    let MmqShape {
        warps,
        tiles,
        stages,
        f16,
    } = shape;
    let nj = tile / 8;
    let (name, smem, block_rows) = if f16 {
        // kernels/mmh.cu's HStage: the rows' planes, then the tokens at a pitch of 272 bytes
        let rows = warps * tiles * 16;
        let record = if kind == crate::weights::Kind::Q4K {
            80
        } else {
            108
        };
        (
            format!("mmh_{}_{nj}_{epi}_w{warps}_r{tiles}_s{stages}", kind.name()),
            (stages * (rows * record + tile * 272)) as u32,
            rows,
        )
    } else if stages > 0 {
        // kernels/mmq.cu's Stage: the rows' records, then two pieces of activations
        let record = if kind == crate::weights::Kind::Q4K {
            48
        } else {
            80
        };
        let stage = tiles * 16 * record + 2 * tile * 32 + 2 * tile * 8;
        let reduce = warps * nj * tiles * 128 * 4;
        (
            format!(
                "mmqs_{}_{nj}_{epi}_w{warps}_r{tiles}_s{stages}",
                kind.name()
            ),
            (warps * stages * stage).max(reduce) as u32,
            16 * tiles,
        )
    } else {
        debug_assert_eq!(tiles, 1, "the register kernels take one row tile");
        (format!("mmq_{}_{nj}_{epi}_w{warps}", kind.name()), 0, 16)
    };
    MmqLaunch {
        name,
        block_rows,
        token_tiles: t.div_ceil(tile) as u32,
        block: 32 * warps as u32,
        smem,
        t8: t.next_multiple_of(tile),
        f16,
    }
}

impl MmqShape {
    /// The register kernel's block (one row tile).
    const fn regs(warps: usize) -> Self {
        Self {
            warps,
            tiles: 1,
            stages: 0,
            f16: false,
        }
    }

    /// The staged kernel's block.
    const fn staged(warps: usize, tiles: usize, stages: usize) -> Self {
        Self {
            warps,
            tiles,
            stages,
            f16: false,
        }
    }

    /// The f16 kernel's block (`warps` x `tiles` x 16 rows).
    const fn half(warps: usize, tiles: usize, stages: usize) -> Self {
        Self {
            warps,
            tiles,
            stages,
            f16: true,
        }
    }
}

/// The block shapes a mat-mat of `kind` for `t` tokens comes in (`kernels/mmq.cu` builds these):
/// 8 warps at 8 tokens, 4 or 8 at 16-32, 4 at 64; for the K-quants the staged kernels at 16-64
/// tokens instead of the register kernel's 8 warps at 64; for Q4_K and Q6_K at 16-64 tokens
/// also the f16 kernel's blocks of 128, 64 and 32 rows (`kernels/mmh.cu`).
pub fn mmq_block_shapes(kind: crate::weights::Kind, t: usize) -> Vec<MmqShape> {
    let mut shapes = int8_block_shapes(kind, t);
    if takes_f16(kind, t) {
        shapes.extend(F16_SHAPES);
    }
    shapes
}

/// The f16 kernel's blocks (`kernels/mmh.cu`'s `MMH_NJ`): 4 warps of two tiles or 8 of one
/// (128 rows, 3 stages), 4 of one (64 rows) and 2 of one (32 rows, 4 stages).
const F16_SHAPES: [MmqShape; 4] = [
    MmqShape::half(4, 2, 3),
    MmqShape::half(8, 1, 3),
    MmqShape::half(4, 1, 4),
    MmqShape::half(2, 1, 4),
];

/// Whether the f16 kernel is built for `kind` at `t` tokens: Q4_K and Q6_K, tiles of 16-64.
fn takes_f16(kind: crate::weights::Kind, t: usize) -> bool {
    use crate::weights::Kind;
    matches!(kind, Kind::Q4K | Kind::Q6K) && mmq_tile(t) >= 16
}

fn int8_block_shapes(kind: crate::weights::Kind, t: usize) -> Vec<MmqShape> {
    let (regs, staged) = (MmqShape::regs, MmqShape::staged);
    let k_quant = kind.k_quant();
    match mmq_tile(t) {
        8 if k_quant => vec![regs(8), regs(16), staged(16, 2, 2)],
        8 => vec![regs(8)],
        16 if k_quant => vec![regs(4), regs(8), staged(16, 2, 2)],
        32 if k_quant => vec![
            regs(4),
            regs(8),
            staged(16, 2, 2),
            staged(8, 2, 3),
            staged(4, 2, 4),
        ],
        64 if k_quant => vec![regs(4), staged(16, 1, 2), staged(4, 2, 3)],
        64 => vec![regs(4)],
        _ => vec![regs(4), regs(8)],
    }
}

/// The block shape of a mat-mat (`gpu-check --perf`, H200, 2026-12-03 17:42 and 12-03 19:47
/// calls: docs/cuda.md has the tables). On rows of 4,096+ columns (64+ units of a K-quant: the
/// shapes measured) the staged kernels, each warp streaming its units through shared memory:
/// where rows are few (<= 4,096, one block an SM) 16 warps (Q6_K at 32 tokens: 8), and at 64
/// tokens on Q4_K's many rows; on many rows 4 warps of two row tiles at 32 tokens, and for Q6_K
/// at 64 (several blocks an SM). At 8 tokens the register kernel, on 16 warps where Q4_K rows
/// are few (4096x12288 24.6 -> 19.8 us) and 8 elsewhere (16 lost on 12,288 rows), except Q6_K's
/// few rows of 128+ units (staged, 33.2 -> 30.4 us). At 16 tokens the staged kernel on many
/// rows too (H100, 2026-12-06 09:42 call: 12288x4096 Q4_K 26.0 us against 37.7 on the 4-warp
/// register kernel picked before, 30.4 on 8 warps; Q6_K 35.9 against 47.6 / 35.7; the 8B's
/// aggregate decode at 12 / 16 sequences +5% / +4%, H200, 10:20 call). The register
/// kernels on short rows (not measured staged): 8 warps where rows are long (128+ units) or
/// few, else 4.
///
/// The f16 kernel (`kernels/mmh.cu`) on Q4_K and Q6_K rows of 4,096+ columns at 9-64 tokens:
/// blocks of 128 rows where rows are 8,192+ (the 8B's gate / up pair, the heads), of 32 rows
/// from 2,048, with `KESTREL_CUDA_MMH=1`: off by default until a GPU has timed it against
/// the int8 kernels (docs/cuda.md, lab book).
pub fn mmq_shape(kind: crate::weights::Kind, rows: usize, cols: usize, t: usize) -> MmqShape {
    match f16_shape(kind, rows, cols, t) {
        Some(s) if f16_on() => s,
        _ => int8_shape(kind, rows, cols, t),
    }
}

/// Whether the f16 mat-mat is asked for (`KESTREL_CUDA_MMH=1`).
fn f16_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KESTREL_CUDA_MMH").is_ok_and(|v| v == "1"))
}

/// The f16 kernel's block for a mat-mat, where it takes one ([`mmq_shape`]).
fn f16_shape(kind: crate::weights::Kind, rows: usize, cols: usize, t: usize) -> Option<MmqShape> {
    let long = cols / unit_cols(kind) >= 64;
    if !(long && takes_f16(kind, t)) {
        None
    } else if rows >= 8192 {
        Some(MmqShape::half(4, 2, 3))
    } else if rows >= 2048 {
        Some(MmqShape::half(2, 1, 4))
    } else {
        None
    }
}

/// The int8 kernels' block for a mat-mat ([`mmq_shape`]'s measured picks).
fn int8_shape(kind: crate::weights::Kind, rows: usize, cols: usize, t: usize) -> MmqShape {
    use crate::weights::Kind;
    let (regs, staged) = (MmqShape::regs, MmqShape::staged);
    let long = kind.k_quant() && cols / unit_cols(kind) >= 64;
    let few = rows <= 4096;
    // Q5_K (not measured on its own) takes Q4_K's picks: the same units and their qh bytes
    let q4k = matches!(kind, Kind::Q4K | Kind::Q5K);
    match mmq_tile(t) {
        8 if long && few && q4k => regs(16),
        8 if few && kind == Kind::Q6K && cols / unit_cols(kind) >= 128 => staged(16, 2, 2),
        8 => regs(8),
        32 if long && few && kind == Kind::Q6K => staged(8, 2, 3),
        16 if long => staged(16, 2, 2),
        32 if long && few => staged(16, 2, 2),
        32 if long => staged(4, 2, 4),
        64 if long && (few || q4k) => staged(16, 1, 2),
        64 if long => staged(4, 2, 3),
        64 => regs(4),
        _ if cols / unit_cols(kind) >= 128 || few => regs(8),
        _ => regs(4),
    }
}

/// Fewest tokens for which a quantized matmul takes the mat-mat: from 5 tokens the mat-vecs run
/// their 8-token form, which the mat-mat's 8-token tile beats (`gpu-check --perf`, H200: Q4_K
/// 12288x4096 22 against 67 us, 4096x12288 44 against 67; Q6_K 53 against 77, 76 against 73).
pub const MMQ_MIN: usize = 5;

/// Whether a matmul of `t` tokens over a `kind` matrix takes the int8 mat-mat.
pub fn takes_mmq(kind: crate::weights::Kind, t: usize) -> bool {
    kind.int8_activations() && (MMQ_MIN..=MMQ_MAX).contains(&t)
}

/// Tokens per tile of the mat-mat for a step of `t` tokens.
fn mmq_tile(t: usize) -> usize {
    if t <= 8 {
        8
    } else if t <= 16 {
        16
    } else if t <= 32 {
        32
    } else {
        64
    }
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
        let f = self.gpu.func("quantize_q")?;
        let (q, qd, ni) = (self.scratch.xq.ptr, self.scratch.xd.ptr, n as i32);
        // SAFETY: as in flush.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&ptr)
                .arg(&q)
                .arg(&qd)
                .arg(&ni)
                .launch(cfg((self.rows(x) as u32, n.div_ceil(256) as u32, 1), 256))?;
        }
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
        let (kind, wrows, wcols, wp) = {
            let m = self.matrix(w)?;
            (m.kind, m.rows, m.cols, m.buf.ptr)
        };
        if takes_mmq(kind, rows) {
            return self.mmq(w, x, op, add);
        }
        if rows > MATVEC_MAX {
            return self.gemm(w, x, op, add);
        }
        let up_ptr = match up {
            Some(u) => self.matrix(u)?.buf.ptr,
            None => 0,
        };
        if kind.int8_activations() {
            self.quantize(x)?;
        }
        let nt = rows.next_power_of_two();
        let epi = if up.is_some() { 2 } else { add as u32 };
        let (name, grid) = matvec_kernel(kind, wrows, wcols, nt, epi);
        let f = self.gpu.func(&name)?;
        let (q, qd) = (self.scratch.xq.ptr, self.scratch.xd.ptr);
        let (r, c, ld, old) = (wrows as i32, wcols as i32, wcols as i32, wrows as i32);
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
                .arg(&xp)
                .arg(&op)
                .arg(&old)
                .launch(cfg((grid, 1, 1), 128))?;
        }
        Ok(())
    }

    /// `out (+)= w · x` on the int8 mat-mat kernel (quantized `w`, at most [`MMQ_MAX`] tokens).
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
            MmqInput::F16(self.scratch.act16.ptr)
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
        let f = self.gpu.func("swiglu")?;
        // SAFETY: as in flush.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&gate)
                .arg(&up)
                .arg(&total)
                .launch(cfg((total.div_ceil(256) as u32, 1, 1), 256))?;
        }
        Ok(())
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

    /// Every shape the mat-mat picks is one `kernels/mmq.cu` builds (and the harness checks):
    /// a picked shape outside the list would be a kernel missing at run time.
    #[test]
    fn picked_mmq_shapes_are_built_ones() {
        for kind in Kind::QUANTIZED {
            for rows in [896, 1024, 1536, 4096, 6144, 12288, 151_936] {
                for cols in [1024, 4096, 12288] {
                    for t in MMQ_MIN..=MMQ_MAX {
                        let f16 = f16_shape(kind, rows, cols, t);
                        for s in [int8_shape(kind, rows, cols, t)].into_iter().chain(f16) {
                            assert!(
                                mmq_block_shapes(kind, t).contains(&s),
                                "{kind:?} {rows}x{cols} t {t}: {s:?}"
                            );
                        }
                    }
                }
            }
        }
        // the measured picks (the 8B's shapes)
        let shape = |warps, tiles, stages| MmqShape {
            warps,
            tiles,
            stages,
            f16: false,
        };
        let half = MmqShape::half;
        assert_eq!(int8_shape(Kind::Q4K, 4096, 12288, 32), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 12288, 32), shape(8, 2, 3));
        assert_eq!(int8_shape(Kind::Q6K, 12288, 4096, 32), shape(4, 2, 4));
        assert_eq!(int8_shape(Kind::Q4K, 12288, 4096, 16), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 12288, 4096, 16), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 12288, 64), shape(16, 1, 2));
        assert_eq!(int8_shape(Kind::Q6K, 12288, 4096, 64), shape(4, 2, 3));
        assert_eq!(int8_shape(Kind::Q4K, 12288, 4096, 64), shape(16, 1, 2));
        assert_eq!(int8_shape(Kind::Q4K, 4096, 4096, 8), shape(16, 1, 0));
        assert_eq!(int8_shape(Kind::Q4K, 12288, 4096, 8), shape(8, 1, 0));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 12288, 8), shape(16, 2, 2));
        assert_eq!(int8_shape(Kind::Q6K, 4096, 4096, 8), shape(8, 1, 0));
        // short rows (the 0.8B's 4096x1024 q + gate) not measured staged: the register kernel
        assert_eq!(int8_shape(Kind::Q4K, 4096, 1024, 32), shape(8, 1, 0));
        // the f16 kernel (when asked for): Q4_K / Q6_K rows of 4,096+ columns at 9-64 tokens,
        // 2,048+ rows
        let f16 = |k, r, c, t| f16_shape(k, r, c, t).unwrap_or_else(|| int8_shape(k, r, c, t));
        assert_eq!(f16(Kind::Q4K, 24576, 4096, 32), half(4, 2, 3));
        assert_eq!(f16(Kind::Q6K, 151_936, 4096, 9), half(4, 2, 3));
        assert_eq!(f16(Kind::Q6K, 4096, 12288, 64), half(2, 1, 4));
        assert_eq!(f16(Kind::Q4K, 4096, 4096, 16), half(2, 1, 4));
        assert_eq!(f16(Kind::Q4K, 12288, 4096, 8), shape(8, 1, 0));
        assert_eq!(f16(Kind::Q4K, 1024, 4096, 32), shape(16, 2, 2));
        assert_eq!(f16(Kind::Q5K, 12288, 4096, 32), shape(4, 2, 4));
        assert_eq!(f16(Kind::Q4K, 4096, 1024, 32), shape(8, 1, 0));
    }
}
