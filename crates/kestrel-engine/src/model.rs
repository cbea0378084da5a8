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

/// Host memory that a step's logits are written into. A `Vec` by default; a GPU backend gives
/// its own ([`StepModel::logits_memory`]): page-locked memory its copies reach by DMA (54.7
/// GB/s on the H200 host against 13.0 through a pageable `Vec`'s staging copies), read by the
/// engine where it lies.
pub trait LogitsMemory: Send {
    /// The memory (at least as long as the last [`LogitsMemory::reserve`]).
    fn as_slice(&self) -> &[f32];
    fn as_mut_slice(&mut self) -> &mut [f32];
    /// Makes room for `n` floats; what was there may be lost.
    fn reserve(&mut self, n: usize) -> Result<(), String>;
}

impl LogitsMemory for Vec<f32> {
    fn as_slice(&self) -> &[f32] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        self
    }
    fn reserve(&mut self, n: usize) -> Result<(), String> {
        if self.len() < n {
            self.resize(n, 0.0);
        }
        Ok(())
    }
}

/// A step's logits: `vocab_size` floats per row, rows in the order of the step's sequences.
/// The engine keeps one across steps, so a step of as many rows as the last writes over the
/// same memory (32 rows of a 248k vocabulary are 32 MB: allocating and zeroing them each step
/// costs more than the GPU's whole step).
pub struct Logits {
    mem: Box<dyn LogitsMemory>,
    len: usize,
}

impl Default for Logits {
    fn default() -> Self {
        Logits::with_memory(Box::new(Vec::new()))
    }
}

impl Logits {
    pub fn with_memory(mem: Box<dyn LogitsMemory>) -> Self {
        Logits { mem, len: 0 }
    }
    /// The logits of the last step.
    pub fn rows(&self) -> &[f32] {
        &self.mem.as_slice()[..self.len]
    }
    /// Makes the logits `n` floats long and returns them to be written (stale contents).
    pub fn fill(&mut self, n: usize) -> Result<&mut [f32], String> {
        self.mem.reserve(n)?;
        self.len = n;
        Ok(&mut self.mem.as_mut_slice()[..n])
    }
    /// Takes `v` as the step's logits.
    pub fn set(&mut self, v: &[f32]) -> Result<(), String> {
        self.fill(v.len())?.copy_from_slice(v);
        Ok(())
    }
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
    /// `logits` `vocab_size` logits for every seq with want_logits (for each of its tokens
    /// when `all_logits`), in order. The engine hands the same [`Logits`] to every step.
    fn forward(&mut self, seqs: &[SeqStep<'_>], logits: &mut Logits) -> Result<(), String>;
    /// The memory the engine should keep this model's logits in (`None`: a `Vec`).
    fn logits_memory(&self) -> Option<Box<dyn LogitsMemory>> {
        None
    }
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
