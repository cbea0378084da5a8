//! Top-k log-probabilities for the OpenAI `logprobs` option.

use crate::candidates::{max_ignoring_nan, top_k_into};
use crate::weights::sum_logit_weights;

/// The `k` most likely tokens with their log-probabilities, i.e. the
/// log-softmax of the raw `logits`, most likely first (ties to the lowest
/// id). NaN logits count as `-inf`. If every logit is `-inf` all
/// log-probabilities are `-inf`.
pub fn logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let max = max_ignoring_nan(logits);
    let mut top = Vec::new();
    top_k_into(logits, k, |_| false, &mut top);
    if max == f32::NEG_INFINITY {
        return top.iter().map(|c| (c.id, f32::NEG_INFINITY)).collect();
    }
    let log_sum = sum_logit_weights(logits, max).ln();
    top.iter()
        .map(|c| {
            let lp = if c.logit == max {
                -log_sum
            } else {
                f64::from(c.logit - max) - log_sum
            };
            (c.id, lp as f32)
        })
        .collect()
}

/// The log-probability of token `id` (log-softmax of the raw `logits` at `id`; NaN counts as
/// `-inf`, as does an `id` outside the logits).
pub fn logprob_of(logits: &[f32], id: u32) -> f32 {
    let max = max_ignoring_nan(logits);
    let Some(&x) = logits.get(id as usize) else {
        return f32::NEG_INFINITY;
    };
    if max == f32::NEG_INFINITY || x.is_nan() {
        return f32::NEG_INFINITY;
    }
    let log_sum = sum_logit_weights(logits, max).ln();
    (f64::from(x - max) - log_sum) as f32
}
