//! The real model behind the engine: `kestrel_models::PagedModel` (a model and its KV block
//! pool) as a [`StepModel`], and the byte budget that sizes the pool.

use crate::model::{SeqStep, StepModel};
use kestrel_models::{KvPool, KvType, ModelConfig, PagedModel};

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

    fn forward(&mut self, seqs: &[SeqStep<'_>]) -> Result<Vec<f32>, String> {
        let steps: Vec<(&[u32], usize, &[u32], bool)> = seqs
            .iter()
            .map(|s| (s.tokens, s.start, s.blocks, s.want_logits))
            .collect();
        self.step(&steps).map_err(|e| e.to_string())
    }

    fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        PagedModel::copy_block(self, src, dst, n_positions)
    }

    fn unsupported(&self) -> Option<String> {
        PagedModel::unsupported(self)
    }
}

/// How the KV pool is sized from a byte budget.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    pub block_size: usize,
    pub n_blocks: usize,
    pub block_bytes: usize,
    pub kv_bytes: u64,
    /// Tokens the pool holds in all (n_blocks * block_size).
    pub tokens: usize,
    /// Weights + KV + scratch.
    pub total_bytes: u64,
    /// The cap the plan had to respect (75% of available memory, or `--max-memory`).
    pub limit_bytes: Option<u64>,
}

/// Fraction of the machine's available memory the engine may plan for by default.
pub const DEFAULT_MEMORY_FRACTION: f64 = 0.75;

/// Sizes the pool: `ctx_size` tokens for each of `parallel` sequences plus one more context's
/// worth as the prefix-cache reserve, capped so weights + KV + scratch stay under `max_memory`
/// (default: 75% of the available memory). Refuses when not even one context fits. Needs only
/// the config, so the plan is known (and printed, or refused) before any weight is loaded.
pub fn plan_pool(
    cfg: &ModelConfig,
    weight_bytes: u64,
    ctx_size: usize,
    parallel: usize,
    block_size: usize,
    kv_type: KvType,
    max_memory: Option<u64>,
) -> Result<PoolPlan, String> {
    let block_bytes = KvPool::block_bytes(cfg.n_kv_layers(), cfg.kv_dim(), block_size, kv_type);
    let scratch =
        kestrel_models::plan::scratch_bytes(cfg, kestrel_models::model::DEFAULT_MAX_BATCH);
    let wanted_tokens = ctx_size * (parallel.max(1) + 1);
    let mut n_blocks = wanted_tokens.div_ceil(block_size);
    let limit = max_memory.or_else(|| {
        kestrel_models::plan::available_memory()
            .map(|a| (a as f64 * DEFAULT_MEMORY_FRACTION) as u64)
    });
    if let Some(limit) = limit {
        let fixed = weight_bytes + scratch;
        let room = limit.saturating_sub(fixed) / block_bytes.max(1) as u64;
        n_blocks = n_blocks.min(room as usize);
        let need = ctx_size.div_ceil(block_size);
        if fixed > limit {
            return Err(format!(
                "the memory budget of {} MiB cannot even hold the weights ({} MiB) and scratch ({} MiB); raise --max-memory or use a smaller model",
                limit >> 20,
                weight_bytes >> 20,
                scratch >> 20
            ));
        }
        if n_blocks < need {
            let fits = n_blocks * block_size;
            return Err(format!(
                "the memory budget of {} MiB cannot hold weights ({} MiB) + scratch ({} MiB) + KV for one {ctx_size}-token context ({} MiB); {fits} tokens of context would fit (lower --ctx-size, use --kv-type q8_0/f16, or raise --max-memory)",
                limit >> 20,
                weight_bytes >> 20,
                scratch >> 20,
                (need * block_bytes) >> 20
            ));
        }
    }
    let kv_bytes = (n_blocks * block_bytes) as u64;
    Ok(PoolPlan {
        block_size,
        n_blocks,
        block_bytes,
        kv_bytes,
        tokens: n_blocks * block_size,
        total_bytes: weight_bytes + kv_bytes + scratch,
        limit_bytes: limit,
    })
}
