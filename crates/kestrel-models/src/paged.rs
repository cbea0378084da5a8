//! A model together with the block pool it stores K/V in, and (hybrid models) the pool of
//! recurrent-state slots: what the serving engine drives. The engine hands out block ids and
//! slot ids and builds block tables; this side stores the data.

use crate::deltanet::StatePool;
use crate::kv::{KvPool, KvType};
use crate::model::{Model, SeqStep, WantLogits};
use crate::ModelError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One sequence's share of a [`PagedModel::step`].
#[derive(Debug, Clone, Copy)]
pub struct PagedStep<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start: usize,
    /// Block table covering `0..start + tokens.len()`.
    pub blocks: &'a [u32],
    /// Recurrent-state slot (hybrid models; ignored by the others).
    pub slot: usize,
    /// Whether the last token's logits are wanted.
    pub want_logits: bool,
    /// Logits of every token instead (verifying speculative tokens).
    pub all_logits: bool,
}

pub struct PagedModel {
    pub model: Model,
    pub pool: KvPool,
    /// Recurrent-state slots (empty for models without recurrent layers): the engine's
    /// running sequences and its snapshots.
    pub states: StatePool,
    /// Tokens that went through forward passes so far (prompt and decode: what really ran).
    /// Shared, so a caller can watch it after handing the model to the engine.
    pub tokens_computed: Arc<AtomicU64>,
}

impl PagedModel {
    /// A model over `n_blocks` KV blocks, with no recurrent-state slots (see
    /// [`PagedModel::with_state_slots`]).
    pub fn new(model: Model, n_blocks: usize, block_size: usize, kv_type: KvType) -> Self {
        let pool = model.new_pool(n_blocks, block_size, kv_type);
        Self {
            model,
            pool,
            states: StatePool::empty(),
            tokens_computed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `n` recurrent-state slots for a hybrid model (no effect on other models).
    pub fn with_state_slots(mut self, n: usize) -> Self {
        if self.model.config.hybrid.is_some() {
            self.states = self.model.new_state_pool(n);
        }
        self
    }

    /// Bytes one block takes across all layers.
    pub fn block_bytes(model: &Model, block_size: usize, kv_type: KvType) -> usize {
        let c = &model.config;
        KvPool::block_bytes(c.n_kv_layers(), c.kv_dim(), block_size, kv_type)
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    /// Recurrent-state slots (0 for models without recurrent layers).
    pub fn state_slots(&self) -> usize {
        if self.states.is_stateful() {
            self.states.n_slots()
        } else {
            0
        }
    }

    /// Copies state slot `src` into `dst`; out-of-range slots are ignored.
    pub fn copy_state(&mut self, src: usize, dst: usize) {
        let n = self.states.n_slots();
        if src < n && dst < n {
            self.states.copy_slot(src, dst);
        }
    }

    /// One batched step; returns the last logits of every step that wants them, in order.
    pub fn step(&mut self, seqs: &[PagedStep<'_>]) -> Result<Vec<f32>, ModelError> {
        if let Some(why) = self.unsupported() {
            return Err(ModelError::Unsupported(why));
        }
        let steps: Vec<SeqStep> = seqs
            .iter()
            .map(|s| SeqStep {
                tokens: s.tokens,
                start: s.start,
                blocks: s.blocks,
                slot: s.slot,
                want: match (s.want_logits, s.all_logits) {
                    (false, _) => WantLogits::None,
                    (true, false) => WantLogits::Last,
                    (true, true) => WantLogits::Verify,
                },
            })
            .collect();
        let out = self
            .model
            .forward_batch(&mut self.pool, &mut self.states, &steps)?;
        let n: u64 = seqs.iter().map(|s| s.tokens.len() as u64).sum();
        self.tokens_computed.fetch_add(n, Ordering::Relaxed);
        Ok(out)
    }

    /// Why the serving engine cannot run this model, if it cannot: a hybrid model (Qwen3.5)
    /// given no recurrent-state slots.
    pub fn unsupported(&self) -> Option<String> {
        let hybrid = self.model.config.hybrid.is_some();
        (hybrid && self.state_slots() == 0).then(|| {
            format!(
                "{}: a hybrid model needs recurrent-state slots (PagedModel::with_state_slots)",
                self.model.config.arch.name()
            )
        })
    }

    pub fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        self.pool.copy_block(src, dst, n_positions);
    }
}
