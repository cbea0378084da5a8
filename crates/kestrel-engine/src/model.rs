//! What the scheduler needs from a model: [`StepModel`] (the contract of docs/engine-api.md).

/// One sequence's share of a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    /// New tokens to run (a prefill chunk, or the one token of a decode step).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; positions `[0, start)` are already in this sequence's blocks.
    pub start: usize,
    /// Block table: KV block ids covering positions [0, start + tokens.len()),
    /// block i holds positions [i*block_size, (i+1)*block_size).
    pub blocks: &'a [u32],
    /// Whether the logits of the last token are wanted (decode steps, last prefill chunk).
    pub want_logits: bool,
    /// Logits of every token of the step, not only the last (verifying speculative tokens);
    /// set only together with `want_logits`.
    pub all_logits: bool,
    /// Recurrent-state slot of the sequence (models with [`StepModel::state_slots`] > 0; 0 and
    /// ignored otherwise). The slot holds the state after positions `[0, start)`; a step with
    /// `start == 0` starts from the empty state (the model clears the slot).
    pub slot: u32,
}

/// A model that runs steps over a paged KV pool that it owns. The engine only hands out
/// block ids; the model stores K/V for those blocks.
///
/// A hybrid model (Qwen3.5) also keeps a fixed-size recurrent state per sequence, in slots it
/// owns ([`StepModel::state_slots`]); the engine gives each running sequence a slot and keeps
/// snapshots in the others ([`StepModel::copy_state`]). The defaults describe a model without
/// recurrent state, which therefore implements neither.
pub trait StepModel: Send {
    fn vocab_size(&self) -> usize;
    /// Number of KV blocks in the model's pool.
    fn kv_blocks(&self) -> usize;
    /// Positions per block.
    fn block_size(&self) -> usize;
    /// Runs all `seqs` in one forward pass (one pass over the weights serves all); leaves in
    /// `logits` (resized to fit) `vocab_size` logits for every seq with want_logits (for each
    /// of its tokens when `all_logits`), in order. The engine hands the same buffer to every
    /// step, so a step allocates nothing for its logits (32 sequences of a 248k vocabulary are
    /// 32 MB: a fresh allocation each step costs more than the GPU's whole step).
    fn forward(&mut self, seqs: &[SeqStep<'_>], logits: &mut Vec<f32>) -> Result<(), String>;
    /// Copies K/V of the first `n_positions` of block `src` into block `dst` (copy-on-write of
    /// a partially filled shared block).
    fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize);
    /// Recurrent-state slots the model holds (0: no recurrent state, K/V alone carry a
    /// sequence). The engine uses the first `max_running` for running sequences and the rest
    /// for snapshots.
    fn state_slots(&self) -> usize {
        0
    }
    /// Copies recurrent-state slot `src` into slot `dst` (a snapshot, or a resume from one).
    fn copy_state(&mut self, _src: u32, _dst: u32) {}
    /// Why this engine cannot serve the model, if it cannot (checked at start): e.g. a hybrid
    /// model given no state slots.
    fn unsupported(&self) -> Option<String> {
        None
    }
}
