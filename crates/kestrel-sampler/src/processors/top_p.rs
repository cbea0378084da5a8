//! Top-p (nucleus) filter.

use crate::weights::{sum_weights, weight};
use crate::Candidates;

/// Keeps the smallest set of most likely candidates whose softmax
/// probability adds up to at least `p` (at least one is kept). `p >= 1`
/// disables.
///
/// Only the best candidates are ever sorted: 64 of them, then 8x as many, until they
/// hold mass `p` (each round one chunked pass over the list), so on a
/// peaked 150k vocabulary only a small prefix is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopP(pub f32);

impl TopP {
    /// Applies the filter.
    pub fn apply(&self, cands: &mut Candidates) {
        let p = f64::from(self.0);
        if p.is_nan() || p >= 1.0 || cands.len() <= 1 {
            return;
        }
        let max = cands.max_logit();
        if max == f32::NEG_INFINITY {
            return;
        }
        let total = sum_weights(cands.as_slice(), max);
        let target = p * total;
        // the best 64, then 8x as many, until their mass reaches the target
        let mut k = 64usize.min(cands.len());
        loop {
            let mut cum = 0.0f64;
            let cut = cands.best(k).iter().position(|c| {
                cum += weight(c.logit, max);
                cum >= target
            });
            if let Some(i) = cut {
                cands.keep_best(i + 1);
                return;
            }
            if k == cands.len() {
                // Rounding left the sum a hair short of p: keep everything.
                return;
            }
            k = k.saturating_mul(8).min(cands.len());
        }
    }
}
