//! What the scheduler needs from a model: [`StepModel`] (the contract of docs/engine-api.md).

/// One sequence's share of a forward step.
#[derive(Debug, Clone, Copy, Default)]
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
    /// Only the argmax of the last token's logits is needed (greedy sampling that reads
    /// nothing else: no penalties, no log-probabilities). A model may then give the argmax
    /// ([`Logits::set_picks`]) and leave the row's floats unwritten: a GPU saves the row's
    /// download and the host's pass over it. Set only together with `want_logits`, never
    /// with `all_logits`.
    pub argmax_only: bool,
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
    /// Takes `v` as the memory itself, if this kind of memory can (a `Vec` can: no copy);
    /// else gives it back.
    fn adopt(&mut self, v: Vec<f32>) -> Result<(), Vec<f32>> {
        Err(v)
    }
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
    fn adopt(&mut self, v: Vec<f32>) -> Result<(), Vec<f32>> {
        *self = v;
        Ok(())
    }
}

/// A step's logits: `vocab_size` floats per row, rows in the order of the step's sequences
/// (and, for rows whose step was `argmax_only`, possibly the model's own argmax instead).
/// The engine keeps one across steps, so a step of as many rows as the last writes over the
/// same memory (32 rows of a 248k vocabulary are 32 MB: allocating and zeroing them each step
/// costs more than the GPU's whole step).
pub struct Logits {
    mem: Box<dyn LogitsMemory>,
    len: usize,
    /// Per row, the argmax the model computed itself (rows of `argmax_only` steps), else None.
    picks: Vec<Option<u32>>,
}

impl Default for Logits {
    fn default() -> Self {
        Logits::with_memory(Box::new(Vec::new()))
    }
}

impl Logits {
    pub fn with_memory(mem: Box<dyn LogitsMemory>) -> Self {
        Logits {
            mem,
            len: 0,
            picks: Vec::new(),
        }
    }
    /// The logits of the last step.
    pub fn rows(&self) -> &[f32] {
        &self.mem.as_slice()[..self.len]
    }
    /// Makes the logits `n` floats long and returns them to be written (stale contents); no
    /// row has a pick until [`Logits::set_picks`].
    pub fn fill(&mut self, n: usize) -> Result<&mut [f32], String> {
        self.mem.reserve(n)?;
        self.len = n;
        self.picks.clear();
        Ok(&mut self.mem.as_mut_slice()[..n])
    }
    /// The argmax of row `row` as the model computed it (only rows of `argmax_only` steps may
    /// have one; their floats are then stale).
    pub fn pick(&self, row: usize) -> Option<u32> {
        self.picks.get(row).copied().flatten()
    }
    /// Sets the rows' picks (one entry per row, in row order) after [`Logits::fill`].
    pub fn set_picks(&mut self, picks: Vec<Option<u32>>) {
        self.picks = picks;
    }
    /// Takes `v` as the step's logits.
    pub fn set(&mut self, v: &[f32]) -> Result<(), String> {
        self.fill(v.len())?.copy_from_slice(v);
        Ok(())
    }
    /// Takes the owned `v` as the step's logits: moved in where the memory is a `Vec` (the CPU
    /// model's step returns one), copied otherwise.
    pub fn set_vec(&mut self, v: Vec<f32>) -> Result<(), String> {
        let n = v.len();
        match self.mem.adopt(v) {
            Ok(()) => {
                self.len = n;
                self.picks.clear();
                Ok(())
            }
            Err(v) => self.set(&v),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory that cannot adopt a Vec (as a GPU's page-locked buffer).
    struct Fixed(Vec<f32>);
    impl LogitsMemory for Fixed {
        fn as_slice(&self) -> &[f32] {
            &self.0
        }
        fn as_mut_slice(&mut self) -> &mut [f32] {
            &mut self.0
        }
        fn reserve(&mut self, n: usize) -> Result<(), String> {
            if self.0.len() < n {
                self.0 = vec![0.0; n];
            }
            Ok(())
        }
    }

    #[test]
    fn logits_are_moved_into_a_vec_and_copied_into_other_memory() {
        let mut l = Logits::default();
        let v = vec![1.0, 2.0, 3.0];
        let at = v.as_ptr();
        l.set_vec(v).unwrap();
        assert_eq!(l.rows(), &[1.0, 2.0, 3.0]);
        assert_eq!(l.rows().as_ptr(), at, "moved, not copied");
        l.fill(2).unwrap().copy_from_slice(&[5.0, 6.0]);
        assert_eq!(l.rows(), &[5.0, 6.0]);
        let mut f = Logits::with_memory(Box::new(Fixed(Vec::new())));
        f.set_vec(vec![7.0; 4]).unwrap();
        assert_eq!(f.rows(), &[7.0; 4]);
        f.set_vec(vec![8.0; 2]).unwrap();
        assert_eq!(f.rows(), &[8.0; 2], "a shorter step over the same memory");
    }
}
