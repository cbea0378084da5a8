//! The final draw from the softmax.

use crate::processors::greedy;
use crate::{Candidates, Xoshiro256StarStar};

/// Unnormalized softmax weight `exp(logit - max)`, exact `1` at the max so
/// that `+inf` logits do not give `inf - inf = NaN`.
#[inline]
pub(crate) fn weight(logit: f32, max: f32) -> f64 {
    if logit == max {
        1.0
    } else {
        f64::from(logit - max).exp()
    }
}

/// Draws a token from the softmax of the candidates' logits.
///
/// Returns `None` only for an empty list. If every logit is `-inf` the
/// lowest id among the candidates is returned.
pub fn sample(cands: &Candidates, rng: &mut Xoshiro256StarStar) -> Option<u32> {
    let max = cands.max_logit();
    if max == f32::NEG_INFINITY {
        return greedy::argmax(cands);
    }
    let slice = cands.as_slice();
    let total: f64 = slice.iter().map(|c| weight(c.logit, max)).sum();
    let u = rng.next_f64() * total;
    let mut acc = 0.0f64;
    let mut last = None;
    for c in slice {
        let w = weight(c.logit, max);
        if w > 0.0 {
            acc += w;
            last = Some(c.id);
            if u < acc {
                return last;
            }
        }
    }
    // Only reachable through rounding; the last possible token is correct.
    last
}
