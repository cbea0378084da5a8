//! The real model behind the engine: `kestrel_models::PagedModel` (a model and its KV block
//! pool) as a [`StepModel`], and the byte budget that sizes the pool.

use crate::model::{Logits, SeqStep, StepModel};
use kestrel_models::{KvPool, KvType, ModelConfig, PagedModel, PagedStep};

impl StepModel for PagedModel {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn kv_blocks(&self) -> usize {
        self.pool.n_blocks()
    }

    fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    fn forward(&mut self, seqs: &[SeqStep<'_>], logits: &mut Logits) -> Result<(), String> {
        let steps: Vec<PagedStep<'_>> = seqs
            .iter()
            .map(|s| PagedStep {
                tokens: s.tokens,
                start: s.start,
                blocks: s.blocks,
                slot: s.slot as usize,
                want_logits: s.want_logits,
                all_logits: s.all_logits,
            })
            .collect();
        logits.set_vec(self.step(&steps).map_err(|e| e.to_string())?)
    }

    fn state_slots(&self) -> usize {
        PagedModel::state_slots(self)
    }

    fn copy_state(&mut self, src: u32, dst: u32) {
        PagedModel::copy_state(self, src as usize, dst as usize)
    }

    fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        PagedModel::copy_block(self, src, dst, n_positions)
    }

    fn unsupported(&self) -> Option<String> {
        PagedModel::unsupported(self)
    }
}

/// How the KV pool (and, for hybrid models, the recurrent-state slots) is sized.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    pub block_size: usize,
    pub n_blocks: usize,
    pub block_bytes: usize,
    pub kv_bytes: u64,
    /// Tokens the pool holds in all (n_blocks * block_size).
    pub tokens: usize,
    /// Bytes of one recurrent-state slot (0 for models without recurrent layers).
    pub state_slot_bytes: usize,
    /// State slots of running sequences (one per `--parallel` sequence; 0 without recurrent
    /// layers).
    pub running_slots: usize,
    /// State slots of the snapshot pool (the bound over all sequences).
    pub snapshot_slots: usize,
    /// Snapshots one sequence keeps at most ([`SNAPSHOTS_PER_SEQUENCE`]; 0 without recurrent
    /// layers).
    pub snapshots_per_seq: usize,
    /// Bytes of every state slot (running + snapshots).
    pub state_bytes: u64,
    /// Host bytes of the logits an end-of-prompt snapshot keeps (one vocabulary row each, for
    /// the whole-prompt reuse of `scheduler/state.rs`), for every snapshot slot.
    pub snapshot_logits_bytes: u64,
    /// Speculative decoding's draft model (0 without one): its weights and its K/V, stored
    /// under the same block ids as the model's (`n_blocks` blocks).
    pub draft_weight_bytes: u64,
    pub draft_kv_bytes: u64,
    /// Weights + KV + state slots + scratch (the draft's included).
    pub total_bytes: u64,
    /// The cap the plan had to respect (75% of available memory, or `--max-memory`).
    pub limit_bytes: Option<u64>,
}

impl PoolPlan {
    /// State slots the model must hold (running + snapshots): `PagedModel::with_state_slots`.
    pub fn state_slots(&self) -> usize {
        self.running_slots + self.snapshot_slots
    }
}

/// Fraction of the machine's available memory the engine may plan for by default.
pub const DEFAULT_MEMORY_FRACTION: f64 = 0.75;

/// Snapshots of the recurrent state one sequence keeps at most (hybrid models): the end of its
/// prompt and the latest chunk boundaries.
pub const SNAPSHOTS_PER_SEQUENCE: usize = 4;

/// Sizes the pool: `ctx_size` tokens for each of `parallel` sequences plus one more context's
/// worth as the prefix-cache reserve, capped so weights + KV + scratch stay under `max_memory`
/// (default: 75% of the available memory). Refuses when not even one context fits. Needs only
/// the config, so the plan is known (and printed, or refused) before any weight is loaded.
///
/// Hybrid models also get one recurrent-state slot per sequence and a snapshot pool of
/// [`SNAPSHOTS_PER_SEQUENCE`] x (`parallel` + 1) slots, shrunk (down to none) before the KV
/// pool is when the budget is tight.
///
/// A speculative draft model (`draft`: its config and weight bytes) adds its weights, its
/// scratch, and its K/V for every block of the pool.
#[allow(clippy::too_many_arguments)]
pub fn plan_pool(
    cfg: &ModelConfig,
    weight_bytes: u64,
    ctx_size: usize,
    parallel: usize,
    block_size: usize,
    kv_type: KvType,
    max_memory: Option<u64>,
    draft: Option<(&ModelConfig, u64)>,
) -> Result<PoolPlan, String> {
    let target_block_bytes =
        KvPool::block_bytes(cfg.n_kv_layers(), cfg.kv_dim(), block_size, kv_type);
    let draft_block_bytes = draft.map_or(0, |(d, _)| {
        KvPool::block_bytes(d.n_kv_layers(), d.kv_dim(), block_size, kv_type)
    });
    let draft_weight_bytes = draft.map_or(0, |(_, w)| w);
    let scratch_of = |c: &ModelConfig| {
        kestrel_models::plan::scratch_bytes(c, kestrel_models::model::DEFAULT_MAX_BATCH)
    };
    let scratch = scratch_of(cfg) + draft.map_or(0, |(d, _)| scratch_of(d));
    let weight_bytes = weight_bytes + draft_weight_bytes;
    // What the planning below sizes per block: both models' K/V.
    let block_bytes = target_block_bytes + draft_block_bytes;
    let parallel = parallel.max(1);
    let slot_bytes = cfg.state_bytes();
    let (running_slots, per_seq) = if slot_bytes > 0 {
        (parallel, SNAPSHOTS_PER_SEQUENCE)
    } else {
        (0, 0)
    };
    // a snapshot also keeps its prompt's last logits (host memory)
    let logits_bytes = if slot_bytes > 0 {
        cfg.vocab_size * 4
    } else {
        0
    };
    let snap_bytes = slot_bytes + logits_bytes;
    let mut snapshot_slots = per_seq * (parallel + 1);
    let running_bytes = (running_slots * slot_bytes) as u64;
    let wanted_tokens = ctx_size * (parallel + 1);
    let mut n_blocks = wanted_tokens.div_ceil(block_size);
    let limit = max_memory.or_else(|| {
        kestrel_models::plan::available_memory()
            .map(|a| (a as f64 * DEFAULT_MEMORY_FRACTION) as u64)
    });
    if let Some(limit) = limit {
        let fixed = weight_bytes + scratch + running_bytes;
        let need = ctx_size.div_ceil(block_size);
        if fixed > limit {
            return Err(format!(
                "the memory budget of {} MiB cannot even hold the weights ({} MiB), scratch ({} MiB) and recurrent state ({} MiB); raise --max-memory or use a smaller model",
                limit >> 20,
                weight_bytes >> 20,
                scratch >> 20,
                running_bytes >> 20
            ));
        }
        let one_ctx = (need * block_bytes) as u64;
        if slot_bytes > 0 {
            let room = limit.saturating_sub(fixed + one_ctx) / snap_bytes as u64;
            snapshot_slots = snapshot_slots.min(room as usize);
        }
        let fixed = fixed + (snapshot_slots * snap_bytes) as u64;
        let room = limit.saturating_sub(fixed) / block_bytes.max(1) as u64;
        n_blocks = n_blocks.min(room as usize);
        if n_blocks < need {
            let fits = n_blocks * block_size;
            return Err(format!(
                "the memory budget of {} MiB cannot hold weights ({} MiB) + scratch ({} MiB) + KV for one {ctx_size}-token context ({} MiB); {fits} tokens of context would fit (lower --ctx-size, use --kv-type q8_0/f16, or raise --max-memory)",
                limit >> 20,
                weight_bytes >> 20,
                scratch >> 20,
                one_ctx >> 20
            ));
        }
    }
    let kv_bytes = (n_blocks * target_block_bytes) as u64;
    let draft_kv_bytes = (n_blocks * draft_block_bytes) as u64;
    let state_bytes = ((running_slots + snapshot_slots) * slot_bytes) as u64;
    let snapshot_logits_bytes = (snapshot_slots * logits_bytes) as u64;
    Ok(PoolPlan {
        block_size,
        n_blocks,
        block_bytes: target_block_bytes,
        kv_bytes,
        tokens: n_blocks * block_size,
        state_slot_bytes: slot_bytes,
        running_slots,
        snapshot_slots,
        snapshots_per_seq: per_seq,
        state_bytes,
        snapshot_logits_bytes,
        draft_weight_bytes,
        draft_kv_bytes,
        total_bytes: weight_bytes
            + kv_bytes
            + draft_kv_bytes
            + state_bytes
            + snapshot_logits_bytes
            + scratch,
        limit_bytes: limit,
    })
}
