//! The device scratch of a model: activation buffers, the 8-bit and f16 copies of activations,
//! decode attention's partial results, the argmax's, and the per-step inputs, all sized once
//! for `max_batch` tokens (and counted in the GPU memory plan by [`Scratch::bytes_for`]); and
//! how many context ranges a step's decode attention takes ([`decode_splits`] on the CUDA
//! cores, [`mma_decode_splits`] on the tensor cores).

use crate::device::{DevBuf, Gpu};
use crate::error::Result;
use crate::mmq::{SPLIT_FLOATS, SPLIT_TILES};
use crate::ops::{MATVEC_MAX, MMQ_MAX};
use kestrel_models::ModelConfig;

/// Activation buffers and per-step inputs, sized once for `max_batch` tokens.
pub struct Scratch {
    pub x: DevBuf,
    pub h: DevBuf,
    pub q: DevBuf,
    pub k: DevBuf,
    pub v: DevBuf,
    pub att: DevBuf,
    pub ffn: DevBuf,
    pub up: DevBuf,
    pub picked: DevBuf,
    pub logits: DevBuf,
    /// The logits rows' argmax (`ops::ARGMAX_PARTS` (value, index) pairs a row, then one i32 a
    /// row): what a greedy row downloads instead of its logits.
    pub argmax: DevBuf,
    /// Hybrid models' buffers (see `Buf`); 16-byte placeholders for the others.
    pub gate: DevBuf,
    pub mixed: DevBuf,
    pub conv: DevBuf,
    pub z: DevBuf,
    pub alpha: DevBuf,
    pub beta: DevBuf,
    pub delta: DevBuf,
    /// Mixture-of-experts models' buffers (`crate::moe::MoeBufs`); placeholders for the others.
    pub moe: crate::moe::MoeBufs,
    pub xq: DevBuf,
    pub xd: DevBuf,
    /// The mat-mat's 8-bit copy (`kernels/mmq.cu`: piece-major, up to MMQ_MAX tokens).
    pub xqt: DevBuf,
    pub xdt: DevBuf,
    pub act16: DevBuf,
    /// The f16 mat-mat's column splits: partial sums and their counters (`mmq::SplitBufs`).
    pub mmq_part: DevBuf,
    pub mmq_count: DevBuf,
    pub wf16: DevBuf,
    pub wf16_elems: usize,
    pub partial: DevBuf,
    /// Finished context ranges per (token, head group) of decode attention; zero between steps.
    pub attn_count: DevBuf,
    /// The step's inputs, one upload: [ids | pos | kv_row | tbl_off | pick | seq_t0 | seq_len |
    /// seq_slot] (max_batch i32 each; the last three per sequence) then the block tables
    /// (tables_cap i32); the fields below point into it.
    pub step_in: DevBuf,
    pub ids: Sub,
    pub pos: Sub,
    pub kv_row: Sub,
    pub tbl_off: Sub,
    pub pick: Sub,
    pub seq_t0: Sub,
    pub seq_len: Sub,
    pub seq_slot: Sub,
    pub tables: Sub,
    pub tables_cap: usize,
    pub max_batch: usize,
}

/// A part of a device buffer.
#[derive(Clone, Copy)]
pub struct Sub {
    pub ptr: u64,
}

/// Sections of `Scratch::step_in` before the block tables.
pub const STEP_SECTIONS: usize = 8;

/// Floats per token of the hybrid models' buffers (0 for dense models).
fn hybrid_floats(cfg: &ModelConfig) -> usize {
    match &cfg.hybrid {
        Some(h) => cfg.q_dim() + 2 * h.conv_channels() + 2 * h.value_dim() + 2 * h.n_v_heads,
        None => 0,
    }
}

/// The widest row a matrix product reads (the 8-bit and f16 activation copies are this wide).
fn widest_input(cfg: &ModelConfig) -> usize {
    let vd = cfg.hybrid.as_ref().map_or(0, |h| h.value_dim());
    cfg.dim.max(cfg.q_dim()).max(cfg.ffn_dim).max(vd)
}

/// f16 elements of the weight-dequantization buffer of the GEMM path (64 MiB): weights are
/// dequantized in row chunks of this size, so prefill scratch does not grow with the vocabulary.
const WF16_ELEMS: usize = 32 << 20;

/// Context ranges of a token's decode attention at most (flash-decoding; a token's context
/// takes one range per 32 positions up to this many; `kernels/attention.cu` merges up to 128).
pub const DECODE_SPLITS: usize = 128;
const _: () = assert!(DECODE_SPLITS <= 128);

/// Blocks a one-token step's decode attention aims at (groups x ranges, ~4 an SM of the
/// H200): the 8B's 8 KV-head groups take 64 ranges (128 were slower, 47.0 against 40.9 us at
/// 16384), the Qwen3.5-9B's 4 groups 128 (51.7 against 63.5 us at 64).
const ATTN_BLOCKS: usize = 512;

/// (token, context range) results the decode attention's scratch holds.
const SPLIT_SLOTS: usize = 512;

/// Context ranges of a step's decode attention per token, for `groups` blocks per token and
/// range (`ops::AttnDecode::groups`): 64-128 for steps of up to [`MATVEC_MAX`] tokens (few sequences:
/// the context is what there is to spread), fewer as the step grows (32 sequences at a
/// context of 4096 still spread each over 16 blocks: 213 against 328 us in one range), one
/// from 512 tokens on. A short context takes fewer (one range per 32 positions).
pub fn decode_splits(t: usize, groups: usize) -> usize {
    let per_token = (ATTN_BLOCKS / groups.max(1)).clamp(64, DECODE_SPLITS);
    per_token.min((SPLIT_SLOTS / t.max(1)).max(1))
}

/// Context ranges a token of the tensor-core decode kernel takes at most: its blocks carry
/// long tiles walks and a merge of their warps, so fewer, longer ranges pay (`gpu-check
/// --perf`, 8B heads at 16384: 29.7 us in 32 ranges against 39.6 in 64).
pub const MMA_DECODE_SPLITS: usize = 32;

/// Context ranges per token of the tensor-core decode kernel: one wave of blocks (`wave`: as
/// many as the GPU's SMs hold at once by the kernel's shared memory) over the step's `t`
/// tokens and `groups` blocks each, up to [`MMA_DECODE_SPLITS`]: the 8B's 8 groups on the
/// H200's 132 SMs at 3 blocks each take 32 ranges for one token, 1 for 32 sequences (157 us at
/// context 4096 against 178 in 16 ranges).
pub fn mma_decode_splits(t: usize, groups: usize, wave: usize) -> usize {
    (wave / (groups * t).max(1))
        .clamp(1, MMA_DECODE_SPLITS)
        .min((SPLIT_SLOTS / t.max(1)).max(1))
}

impl Scratch {
    /// Bytes of scratch for a model and a step size, for the memory plan.
    pub fn bytes_for(cfg: &ModelConfig, max_batch: usize, max_table: usize) -> u64 {
        let t = max_batch as u64;
        let widest = widest_input(cfg) as u64;
        let f32s = t
            * (3 * cfg.dim
                + 2 * cfg.q_dim()
                + 2 * cfg.kv_dim()
                + 2 * cfg.ffn_dim
                + cfg.vocab_size
                + hybrid_floats(cfg)) as u64;
        let q8 = (MATVEC_MAX + MMQ_MAX) as u64 * widest * 3;
        let act16 = t * widest * 2;
        let partial =
            (Self::partial_floats(cfg) + max_batch.max(MATVEC_MAX) * cfg.n_heads) as u64 * 4;
        4 * f32s
            + t * crate::ops::argmax_bytes_per_row()
            + q8
            + act16
            + 4 * (SPLIT_FLOATS + SPLIT_TILES) as u64
            + WF16_ELEMS as u64 * 2
            + partial
            + 4 * (STEP_SECTIONS as u64 * t + max_table as u64)
            + crate::moe::MoeBufs::bytes_for(cfg, max_batch)
    }

    /// Decode attention's per-range results (a step's tokens x its ranges ([`decode_splits`],
    /// [`mma_decode_splits`]) of them at most [`SPLIT_SLOTS`]), `head_dim + 4` floats each.
    fn partial_floats(cfg: &ModelConfig) -> usize {
        SPLIT_SLOTS * cfg.n_heads * (cfg.head_dim + 4)
    }

    pub(crate) fn new(
        gpu: &Gpu,
        cfg: &ModelConfig,
        max_batch: usize,
        max_table: usize,
    ) -> Result<Self> {
        let t = max_batch;
        let widest = widest_input(cfg);
        let (ch, vd, nv) = cfg.hybrid.as_ref().map_or((0, 0, 0), |h| {
            (h.conv_channels(), h.value_dim(), h.n_v_heads)
        });
        let gated = if cfg.hybrid.is_some() { cfg.q_dim() } else { 0 };
        let f = |n: usize| -> Result<DevBuf> {
            let b = gpu.alloc(n * 4)?;
            gpu.write(b.ptr, &vec![0u8; n * 4])?;
            Ok(b)
        };
        Ok(Self {
            x: f(t * cfg.dim)?,
            h: f(t * cfg.dim)?,
            q: f(t * cfg.q_dim())?,
            k: f(t * cfg.kv_dim())?,
            v: f(t * cfg.kv_dim())?,
            att: f(t * cfg.q_dim())?,
            ffn: f(t * cfg.ffn_dim)?,
            up: f(t * cfg.ffn_dim)?,
            picked: f(t * cfg.dim)?,
            logits: gpu.alloc(t * cfg.vocab_size * 4)?,
            argmax: gpu.alloc(t * crate::ops::argmax_bytes_per_row() as usize)?,
            gate: f(t * gated)?,
            mixed: f(t * ch)?,
            conv: f(t * ch)?,
            z: f(t * vd)?,
            alpha: f(t * nv)?,
            beta: f(t * nv)?,
            delta: f(t * vd)?,
            moe: crate::moe::MoeBufs::new(gpu, cfg, t)?,
            xq: f(MATVEC_MAX * widest / 4 + 4)?,
            xd: f(MATVEC_MAX * widest.div_ceil(32) * 2 + 2)?,
            xqt: f(MMQ_MAX * widest / 4 + 4)?,
            xdt: f(MMQ_MAX * widest.div_ceil(32) * 2 + 2)?,
            act16: gpu.alloc(t * widest * 2)?,
            mmq_part: gpu.alloc(SPLIT_FLOATS * 4)?,
            mmq_count: f(SPLIT_TILES)?,
            wf16: gpu.alloc(WF16_ELEMS * 2)?,
            wf16_elems: WF16_ELEMS,
            partial: f(Self::partial_floats(cfg))?,
            attn_count: f(t.max(MATVEC_MAX) * cfg.n_heads)?,
            step_in: f(STEP_SECTIONS * t + max_table)?,
            ids: Sub { ptr: 0 },
            pos: Sub { ptr: 0 },
            kv_row: Sub { ptr: 0 },
            tbl_off: Sub { ptr: 0 },
            pick: Sub { ptr: 0 },
            seq_t0: Sub { ptr: 0 },
            seq_len: Sub { ptr: 0 },
            seq_slot: Sub { ptr: 0 },
            tables: Sub { ptr: 0 },
            tables_cap: max_table,
            max_batch: t,
        }
        .with_parts())
    }

    fn with_parts(mut self) -> Self {
        let (base, t) = (self.step_in.ptr, (self.max_batch * 4) as u64);
        self.ids = Sub { ptr: base };
        self.pos = Sub { ptr: base + t };
        self.kv_row = Sub { ptr: base + 2 * t };
        self.tbl_off = Sub { ptr: base + 3 * t };
        self.pick = Sub { ptr: base + 4 * t };
        self.seq_t0 = Sub { ptr: base + 5 * t };
        self.seq_len = Sub { ptr: base + 6 * t };
        self.seq_slot = Sub { ptr: base + 7 * t };
        self.tables = Sub {
            ptr: base + STEP_SECTIONS as u64 * t,
        };
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decode attention's partial results are sized for SPLIT_SLOTS (token, range) pairs
    /// (a step in one range writes none) and its kernel merges at most 128 ranges: no step
    /// size or head layout may ask for more.
    #[test]
    fn decode_splits_stay_within_the_scratch_and_the_merge() {
        for groups in 1..=64 {
            for t in 1..=2048 {
                let s = decode_splits(t, groups);
                assert!(
                    (1..=DECODE_SPLITS).contains(&s),
                    "t {t} groups {groups}: {s}"
                );
                assert!(s == 1 || t * s <= SPLIT_SLOTS, "t {t} groups {groups}: {s}");
            }
        }
        // the measured choices: the 8B's 8 groups 64 ranges, the 9B's 4 groups 128, 32
        // sequences 16 each, one range from 512 tokens on
        assert_eq!(decode_splits(1, 8), 64);
        assert_eq!(decode_splits(1, 4), 128);
        assert_eq!(decode_splits(32, 8), 16);
        assert_eq!(decode_splits(512, 4), 1);
        for groups in 1..=64 {
            for t in 1..=2048 {
                for wave in [1, 132, 396, 792, 4096] {
                    let s = mma_decode_splits(t, groups, wave);
                    assert!((1..=MMA_DECODE_SPLITS).contains(&s));
                    assert!(s == 1 || t * s <= SPLIT_SLOTS);
                }
            }
        }
        assert_eq!(mma_decode_splits(1, 8, 396), 32);
        assert_eq!(mma_decode_splits(32, 8, 396), 1);
        assert_eq!(mma_decode_splits(8, 8, 396), 6);
    }
}
