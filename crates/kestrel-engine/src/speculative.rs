//! Speculative decoding, the per-sequence half: where proposals come from (n-gram lookup in
//! the sequence itself) and how many to make (k adapted to the recent acceptance, paused when
//! it does not pay). The scheduler half (drafting with a draft model, verification in one
//! forward pass, roll-back) is `scheduler/speculate.rs`.

use kestrel_sampler::{Distribution, Sampler};

/// Longest and shortest n-gram matched by [`lookup`]: the longest match is tried first, as it
/// is the most likely to continue the same way.
const LOOKUP_MAX_NGRAM: usize = 4;
const LOOKUP_MIN_NGRAM: usize = 2;

/// Acceptance below this (a moving average of accepted / proposed) pauses speculation for
/// [`PAUSE_STEPS`] decode steps: the verification tokens then cost more than they save.
const PAUSE_BELOW: f64 = 0.15;
const PAUSE_STEPS: usize = 16;
/// Weight of the newest step in the moving average.
const EMA_WEIGHT: f64 = 0.3;

/// One sequence's speculation state and counters.
#[derive(Debug, Clone)]
pub(crate) struct SpecState {
    /// Tokens to propose at the next step (adapted between 1 and the configured maximum).
    pub k: usize,
    pub k_max: usize,
    /// Moving average of the fraction of proposals kept.
    acceptance: f64,
    /// Decode steps left before speculation is tried again.
    pub pause: usize,
    /// Draft mode: positions whose draft-model K/V are valid (`tokens[..draft_computed]`).
    pub draft_computed: usize,
    /// Draft mode: the request's sampling chain for the draft's own draws (own RNG).
    pub draft_sampler: Option<Sampler>,
    /// Draft mode: the distributions the pending proposals were drawn from, in order.
    pub drafts_q: Vec<Distribution>,
    /// Forward steps that produced generated tokens (after the first), and the proposals.
    pub decode_steps: usize,
    pub proposed: usize,
    pub accepted: usize,
}

impl SpecState {
    pub fn new(k_max: usize, computed: usize, draft_sampler: Option<Sampler>) -> Self {
        Self {
            k: k_max,
            k_max,
            acceptance: 1.0,
            pause: 0,
            draft_computed: computed,
            draft_sampler,
            drafts_q: Vec::new(),
            decode_steps: 0,
            proposed: 0,
            accepted: 0,
        }
    }

    /// Books a verified step: `accepted` of `proposed` tokens kept. k grows by one after a
    /// step that kept everything and falls to one past what was kept otherwise; a low
    /// acceptance pauses speculation.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.proposed += proposed;
        self.accepted += accepted;
        let rate = accepted as f64 / proposed.max(1) as f64;
        self.acceptance = (1.0 - EMA_WEIGHT) * self.acceptance + EMA_WEIGHT * rate;
        self.k = if accepted == proposed {
            (self.k + 1).min(self.k_max)
        } else {
            (accepted + 1).min(self.k_max)
        };
        if self.acceptance < PAUSE_BELOW {
            self.pause = PAUSE_STEPS;
            // Start again from a neutral estimate after the pause.
            self.acceptance = 0.5;
            self.k = 1;
        }
    }
}

/// Up to `k` tokens that followed the latest earlier occurrence of the sequence's last n
/// tokens (n from [`LOOKUP_MAX_NGRAM`] down to [`LOOKUP_MIN_NGRAM`]); empty when none
/// occurred before. The prompt and the output are searched alike: an agent that re-emits a
/// file it was given, or repeats its own earlier lines, copies from either.
pub(crate) fn lookup(tokens: &[u32], k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (LOOKUP_MIN_NGRAM..=LOOKUP_MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let pattern = &tokens[len - n..];
        // Latest match first: the nearest context is the most likely to repeat.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == pattern {
                let from = start + n;
                let to = (from + k).min(len);
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_longest_match() {
        // "1 2 3 4 | 9 9 | 1 2 3 4 | 5 6 7 | 2 3 4" ends with the 3-gram 2 3 4; its latest
        // earlier occurrence (positions 7..10) is followed by 5 6 7.
        let t = [1, 2, 3, 4, 9, 9, 1, 2, 3, 4, 5, 6, 7, 2, 3, 4];
        assert_eq!(lookup(&t, 2), vec![5, 6]);
        assert_eq!(lookup(&t, 8), vec![5, 6, 7, 2, 3, 4]);
        assert_eq!(lookup(&t, 0), Vec::<u32>::new());
    }

    #[test]
    fn lookup_needs_a_two_token_match() {
        assert_eq!(lookup(&[1, 2, 3, 1], 4), Vec::<u32>::new());
        assert_eq!(lookup(&[7, 8, 5, 7, 8], 4), vec![5, 7, 8]);
        assert_eq!(lookup(&[], 4), Vec::<u32>::new());
    }

    #[test]
    fn k_adapts_and_low_acceptance_pauses() {
        let mut s = SpecState::new(8, 0, None);
        s.record(8, 8);
        assert_eq!(s.k, 8);
        s.record(8, 2);
        assert_eq!(s.k, 3);
        s.record(3, 3);
        assert_eq!(s.k, 4);
        for _ in 0..6 {
            s.record(4, 0);
        }
        assert_eq!((s.pause, s.k), (PAUSE_STEPS, 1));
        assert_eq!((s.proposed, s.accepted), (8 + 8 + 3 + 24, 13));
    }
}
