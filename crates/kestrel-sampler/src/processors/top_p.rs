//! Top-p (nucleus) filter.

use crate::weights::{sum_weights, weight};
use crate::Candidates;

/// Keeps the smallest set of most likely candidates whose softmax
/// probability adds up to at least `p` (at least one is kept). `p >= 1`
/// disables.
///
/// Only the best candidates are ever sorted: 64 of them, then 512, then 4,096, until they
/// hold mass `p` (each round one chunked pass over the list), so on a peaked 150k vocabulary
/// only a small prefix is, and the kept candidates stay sorted. A flatter distribution (a
/// random-weight model, a step the model is unsure of) whose nucleus is larger than that is
/// cut by a weighted selection instead (`Candidates::keep_mass`: a few passes, the kept
/// candidates unsorted; the draw does not need them sorted), where sorting the whole
/// vocabulary took ~10 ms a token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopP(pub f32);

/// The largest nucleus found by sorting the best candidates; past it, `Candidates::keep_mass`.
const SORTED_MOST: usize = 4096;

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
        // every weight is at most 1 (the max's): past SORTED_MOST at once when even that many
        // could not reach the target
        if target > SORTED_MOST as f64 {
            cands.keep_mass(target, max);
            return;
        }
        // the best 64, then 8x as many up to 4,096, until their mass reaches the target
        let mut k = 64usize.min(cands.len());
        loop {
            let (cut, cum, kth) = {
                let best = cands.best(k);
                let mut cum = 0.0f64;
                let cut = best.iter().position(|c| {
                    cum += weight(c.logit, max);
                    cum >= target
                });
                (cut, cum, best.last().map_or(0.0, |c| weight(c.logit, max)))
            };
            if let Some(i) = cut {
                cands.keep_best(i + 1);
                return;
            }
            if k == cands.len() {
                // Rounding left the sum a hair short of p: keep everything.
                return;
            }
            // no later candidate outweighs the k-th: past SORTED_MOST when even that many
            // of its weight would fall short
            if k >= SORTED_MOST || cum + (SORTED_MOST - k) as f64 * kth < target {
                cands.keep_mass(target, max);
                return;
            }
            k = k.saturating_mul(8).min(cands.len());
        }
    }
}
