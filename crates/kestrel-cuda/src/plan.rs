//! The GPU memory plan: weights + KV pool + scratch (+ the recurrent-state slots of hybrid
//! models) in device memory, computed from the config before any weight is uploaded, capped
//! below the device's free memory, and refused with what would fit.

use crate::error::{CudaError, Result};
use crate::model::{KvDev, Scratch};
use kestrel_models::ModelConfig;

/// Fraction of the device's free memory a plan may take by default (the rest: the CUDA
/// context's own allocations, cuBLAS workspaces, graphs).
pub const DEFAULT_FRACTION: f64 = 0.90;

#[derive(Debug, Clone, PartialEq)]
pub struct GpuPlan {
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub scratch_bytes: u64,
    /// Hybrid models: bytes of one sequence's recurrent state, the slots for running sequences
    /// and for snapshots (as the CPU's plan: at most `snapshots_per_seq` per sequence), and
    /// their bytes in all. Zero for the others.
    pub state_slot_bytes: u64,
    pub running_slots: usize,
    pub snapshot_slots: usize,
    pub snapshots_per_seq: usize,
    pub state_bytes: u64,
    pub total_bytes: u64,
    pub limit_bytes: u64,
    pub free_bytes: u64,
    pub n_blocks: usize,
    pub block_size: usize,
    pub tokens: usize,
}

/// Sizes the KV pool for `ctx_size` tokens for each of `parallel` sequences (plus one
/// context of prefix-cache reserve) within `max_memory` (default: 90% of `free_bytes`). A hybrid
/// model's running slots are fixed costs; its snapshot slots shrink (down to none) before the
/// KV pool does.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    cfg: &ModelConfig,
    weight_bytes: u64,
    ctx_size: usize,
    parallel: usize,
    block_size: usize,
    max_batch: usize,
    free_bytes: u64,
    max_memory: Option<u64>,
) -> Result<GpuPlan> {
    let block_bytes = KvDev::bytes_for(cfg, 1, block_size).max(1);
    let max_table = max_batch.max(crate::ops::MATVEC_MAX) * ctx_size.div_ceil(block_size);
    let scratch = Scratch::bytes_for(cfg, max_batch, max_table);
    let limit = max_memory
        .unwrap_or((free_bytes as f64 * DEFAULT_FRACTION) as u64)
        .min(free_bytes);
    let mib = |b: u64| b >> 20;
    let slot_bytes = cfg.state_bytes() as u64;
    let (running_slots, per_seq) = if slot_bytes > 0 {
        (parallel.max(1), kestrel_engine::SNAPSHOTS_PER_SEQUENCE)
    } else {
        (0, 0)
    };
    let fixed = weight_bytes + scratch + running_slots as u64 * slot_bytes;
    if fixed > limit {
        return Err(CudaError::Plan(format!(
            "{} MiB of device memory may be used ({} MiB free) but the weights ({} MiB), scratch ({} MiB) and recurrent state ({} MiB) need {} MiB; use a smaller model or --device cpu",
            mib(limit), mib(free_bytes), mib(weight_bytes), mib(scratch), mib(running_slots as u64 * slot_bytes), mib(fixed)
        )));
    }
    let need = ctx_size.div_ceil(block_size);
    let mut snapshot_slots = per_seq * (parallel.max(1) + 1);
    if let Some(room) = limit
        .saturating_sub(fixed + need as u64 * block_bytes)
        .checked_div(slot_bytes)
    {
        snapshot_slots = snapshot_slots.min(room as usize);
    }
    let state_bytes = (running_slots + snapshot_slots) as u64 * slot_bytes;
    let fixed = weight_bytes + scratch + state_bytes;
    let wanted = (ctx_size * (parallel.max(1) + 1)).div_ceil(block_size);
    let room = (limit.saturating_sub(fixed) / block_bytes) as usize;
    let n_blocks = wanted.min(room);
    if n_blocks < need {
        return Err(CudaError::Plan(format!(
            "{} MiB of device memory may be used: weights {} MiB + scratch {} MiB leave room for {} tokens of KV, less than one {ctx_size}-token context ({} MiB); lower --ctx-size or raise --max-memory",
            mib(limit), mib(weight_bytes), mib(scratch), n_blocks * block_size, mib(need as u64 * block_bytes)
        )));
    }
    let kv_bytes = n_blocks as u64 * block_bytes;
    Ok(GpuPlan {
        weight_bytes,
        kv_bytes,
        scratch_bytes: scratch,
        state_slot_bytes: slot_bytes,
        running_slots,
        snapshot_slots,
        snapshots_per_seq: per_seq,
        state_bytes,
        total_bytes: weight_bytes + kv_bytes + scratch + state_bytes,
        limit_bytes: limit,
        free_bytes,
        n_blocks,
        block_size,
        tokens: n_blocks * block_size,
    })
}

impl std::fmt::Display for GpuPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "GPU memory plan: weights {:.0} MiB + KV {:.0} MiB ({} blocks of {} tokens = {} tokens, f16) + scratch {:.0} MiB",
            mib(self.weight_bytes), mib(self.kv_bytes), self.n_blocks, self.block_size, self.tokens,
            mib(self.scratch_bytes)
        )?;
        if self.state_bytes > 0 {
            write!(
                f,
                " + recurrent state {:.0} MiB ({:.1} MiB per sequence x {} running + {} snapshots, at most {} per sequence)",
                mib(self.state_bytes), mib(self.state_slot_bytes), self.running_slots,
                self.snapshot_slots, self.snapshots_per_seq
            )?;
        }
        write!(
            f,
            " = {:.0} MiB (limit {:.0} MiB of {:.0} MiB free)",
            mib(self.total_bytes),
            mib(self.limit_bytes),
            mib(self.free_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        ModelConfig {
            arch: kestrel_models::Arch::Qwen2,
            n_layers: 28,
            dim: 1536,
            ffn_dim: 8960,
            n_heads: 12,
            n_kv_heads: 2,
            head_dim: 128,
            vocab_size: 151936,
            rms_eps: 1e-6,
            rope_base: 1e6,
            rope_dim: 128,
            rope_layout: kestrel_models::RopeLayout::NeoX,
            max_context: 32768,
            hybrid: None,
            moe: None,
        }
    }

    #[test]
    fn plan_fits_and_is_capped() {
        let p = plan(&cfg(), 1 << 30, 4096, 1, 16, 512, 100 << 30, None).unwrap();
        assert_eq!(p.tokens, 8192);
        assert!(p.total_bytes <= p.limit_bytes);
        let small = plan(&cfg(), 1 << 30, 4096, 64, 16, 512, 3 << 30, None).unwrap();
        assert!(small.tokens < 4096 * 65 && small.tokens >= 4096);
    }

    #[test]
    fn plan_refuses_with_what_fits() {
        let e = plan(&cfg(), 1 << 30, 32768, 1, 16, 512, 2 << 30, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tokens of KV"), "{e}");
        let e = plan(&cfg(), 8 << 30, 4096, 1, 16, 512, 4 << 30, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("weights"), "{e}");
    }
}
