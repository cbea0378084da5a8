//! Top-k log-probabilities for the OpenAI `logprobs` option.

use crate::candidates::{top_k_into, Candidate};
use crate::processors::dist::weight;

/// The `k` most likely tokens with their log-probabilities, i.e. the
/// log-softmax of the raw `logits`, most likely first (ties to the lowest
/// id). NaN logits count as `-inf`. If every logit is `-inf` all
/// log-probabilities are `-inf`.
pub fn logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let clean = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let max = logits
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| m.max(clean(l)));
    let top = top_k(logits, k, clean);
    if max == f32::NEG_INFINITY {
        return top.iter().map(|c| (c.id, f32::NEG_INFINITY)).collect();
    }
    let log_sum: f64 = logits
        .iter()
        .map(|&l| weight(clean(l), max))
        .sum::<f64>()
        .ln();
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

/// The `k` best candidates, sorted.
fn top_k(logits: &[f32], k: usize, clean: impl Fn(f32) -> f32) -> Vec<Candidate> {
    let all = logits.iter().enumerate().map(|(i, &l)| Candidate {
        id: i as u32,
        logit: clean(l),
    });
    let mut best = Vec::new();
    top_k_into(all, k, &mut best);
    best
}
