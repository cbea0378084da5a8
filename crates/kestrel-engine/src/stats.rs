//! Engine statistics (a snapshot the scheduler publishes after every step).

/// Pool occupancy, queue, and cumulative counters since start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub blocks_total: usize,
    /// Unreferenced, not cached.
    pub blocks_free: usize,
    /// Referenced by running sequences.
    pub blocks_used: usize,
    /// Unreferenced but in the prefix index (evictable).
    pub blocks_cached: usize,
    /// Promised to running sequences, not yet handed out.
    pub blocks_reserved: usize,
    /// Requests waiting for admission.
    pub queue_depth: usize,
    /// Requests admitted (prefilling or decoding).
    pub running: usize,
    /// Requests accepted by `submit`.
    pub requests: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, taken from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Prompt tokens the model actually ran (summed over the prefill `SeqStep`s passed to
    /// `forward`).
    pub computed_prompt_tokens: u64,
    /// Decode tokens the model ran (one per decode `SeqStep`).
    pub computed_decode_tokens: u64,
    pub generated_tokens: u64,
    pub forward_steps: u64,
    /// Time inside the model's `forward` (logits downloaded included), and in what follows
    /// it: indexing the new blocks, sampling, streaming (nanoseconds, summed over steps).
    pub forward_ns: u64,
    pub sample_ns: u64,
    /// Most sequences in one `forward` call.
    pub max_step_seqs: usize,
    /// Most decode sequences in one `forward` call.
    pub max_step_decodes: usize,
    /// Hybrid models: the recurrent-state snapshot pool's size and the snapshots held now.
    pub snapshots_total: usize,
    pub snapshots_used: usize,
    /// Snapshots taken, and evicted to make room for newer ones, since start.
    pub snapshots_taken: u64,
    pub snapshots_evicted: u64,
    /// Speculative decoding: steps that verified proposals, tokens proposed, tokens kept.
    pub spec_steps: u64,
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    /// Hybrid models: kept tokens run again after a rejection to bring the recurrent state
    /// back to them.
    pub spec_redone_tokens: u64,
}
