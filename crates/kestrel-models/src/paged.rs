//! A model together with the block pool it stores K/V in: what the serving engine drives.
//! The engine hands out block ids and builds block tables; this side stores the data.

use crate::deltanet::StatePool;
use crate::kv::{KvPool, KvType};
use crate::model::{Model, SeqStep, WantLogits};
use crate::ModelError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct PagedModel {
    pub model: Model,
    pub pool: KvPool,
    /// Tokens that went through forward passes so far (prompt and decode: what really ran).
    /// Shared, so a caller can watch it after handing the model to the engine.
    pub tokens_computed: Arc<AtomicU64>,
}

impl PagedModel {
    pub fn new(model: Model, n_blocks: usize, block_size: usize, kv_type: KvType) -> Self {
        let pool = model.new_pool(n_blocks, block_size, kv_type);
        Self {
            model,
            pool,
            tokens_computed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes one block takes across all layers.
    pub fn block_bytes(model: &Model, block_size: usize, kv_type: KvType) -> usize {
        let c = &model.config;
        KvPool::block_bytes(c.n_kv_layers(), c.kv_dim(), block_size, kv_type)
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    /// One batched step; `want_last[i]` says whether sequence i wants its last logits.
    pub fn step(&mut self, seqs: &[(&[u32], usize, &[u32], bool)]) -> Result<Vec<f32>, ModelError> {
        if let Some(why) = self.unsupported() {
            return Err(ModelError::Unsupported(why));
        }
        let steps: Vec<SeqStep> = seqs
            .iter()
            .map(|&(tokens, start, blocks, want)| SeqStep {
                tokens,
                start,
                blocks,
                slot: 0,
                want: if want {
                    WantLogits::Last
                } else {
                    WantLogits::None
                },
            })
            .collect();
        let out = self
            .model
            .forward_batch(&mut self.pool, &mut StatePool::empty(), &steps)?;
        let n: u64 = seqs.iter().map(|s| s.0.len() as u64).sum();
        self.tokens_computed.fetch_add(n, Ordering::Relaxed);
        Ok(out)
    }

    /// Why the serving engine cannot run this model yet, if it cannot: the engine does not
    /// hand out recurrent-state slots, so hybrid models (Qwen3.5) are refused at start.
    pub fn unsupported(&self) -> Option<String> {
        self.model.config.hybrid.as_ref().map(|_| {
            format!(
                "{}: the serving engine does not keep recurrent state yet, so `run`, `chat` and \
                 `serve` cannot drive this model; `kestrel logits` and `bench` can",
                self.model.config.arch.name()
            )
        })
    }

    pub fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        self.pool.copy_block(src, dst, n_positions);
    }
}
