//! What the scheduler needs from a model: [`StepModel`] (the contract of docs/engine-api.md).

/// One sequence's share of a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    /// New tokens to run (a prefill chunk, or the one token of a decode step).
    pub tokens: &'a [u32],
    /// Position of tokens[0]; positions [0, start) are already in this sequence's blocks.
    pub start: usize,
    /// Block table: KV block ids covering positions [0, start + tokens.len()),
    /// block i holds positions [i*block_size, (i+1)*block_size).
    pub blocks: &'a [u32],
    /// Whether the logits of the last token are wanted (decode steps, last prefill chunk).
    pub want_logits: bool,
}

/// A model that runs steps over a paged KV pool that it owns. The engine only hands out
/// block ids; the model stores K/V for those blocks.
///
/// A hybrid model (Qwen3.5) will also need a recurrent-state slot per sequence and snapshots
/// at chunk boundaries; that will come as new methods with default implementations, so models
/// without recurrent state do not change.
pub trait StepModel: Send {
    fn vocab_size(&self) -> usize;
    /// Number of KV blocks in the model's pool.
    fn kv_blocks(&self) -> usize;
    /// Positions per block.
    fn block_size(&self) -> usize;
    /// Runs all `seqs` in one forward pass (one pass over the weights serves all); returns
    /// `vocab_size` logits for every seq with want_logits, in order.
    fn forward(&mut self, seqs: &[SeqStep<'_>]) -> Result<Vec<f32>, String>;
    /// Copies K/V of the first `n_positions` of block `src` into block `dst` (copy-on-write of
    /// a partially filled shared block).
    fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize);
    /// Why this engine cannot serve the model, if it cannot (checked at start): e.g. a hybrid
    /// model whose recurrent state the engine does not keep yet.
    fn unsupported(&self) -> Option<String> {
        None
    }
}
