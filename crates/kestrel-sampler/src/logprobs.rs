//! Top-k log-probabilities for the OpenAI `logprobs` option.

use crate::candidates::{max_ignoring_nan, top_k_into};
use crate::weights::sum_logit_weights;

/// The `k` most likely tokens with their log-probabilities, i.e. the
/// log-softmax of the raw `logits`, most likely first (ties to the lowest
/// id). NaN logits count as `-inf`. If every logit is `-inf` all
/// log-probabilities are `-inf`.
pub fn logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    token_logprobs(logits, 0, k).1
}

/// The log-probability of token `id` (log-softmax of the raw `logits` at `id`; NaN counts as
/// `-inf`, as does an `id` outside the logits).
pub fn logprob_of(logits: &[f32], id: u32) -> f32 {
    token_logprobs(logits, id, 0).0
}

/// Both at once, the softmax's sum computed once: token `id`'s log-probability (as
/// [`logprob_of`]) and the `k` most likely tokens with theirs (as [`logprobs`]).
pub fn token_logprobs(logits: &[f32], id: u32, k: usize) -> (f32, Vec<(u32, f32)>) {
    let k = k.min(logits.len());
    let mut top = Vec::new();
    top_k_into(logits, k, |_| false, &mut top);
    let max = max_ignoring_nan(logits);
    let chosen = logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| {
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            l
        }
    });
    if max == f32::NEG_INFINITY {
        let top = top.iter().map(|c| (c.id, f32::NEG_INFINITY)).collect();
        return (f32::NEG_INFINITY, top);
    }
    let log_sum = sum_logit_weights(logits, max).ln();
    let lp = |l: f32| {
        if l == max {
            (-log_sum) as f32
        } else {
            (f64::from(l - max) - log_sum) as f32
        }
    };
    let chosen = if chosen == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        lp(chosen)
    };
    (chosen, top.iter().map(|c| (c.id, lp(c.logit))).collect())
}
