//! Top-p (nucleus) filter.

use crate::weights::{sum_weights, weight};
use crate::Candidates;

/// Keeps the smallest set of most likely candidates whose softmax
/// probability adds up to at least `p` (at least one is kept). `p >= 1`
/// disables.
///
/// The list is sorted only as far as needed: the prefix grows geometrically
/// from 64 candidates until it holds mass `p`, so on a peaked 150k vocab
/// only a small prefix is ever sorted.
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
        let mut k = 64usize.min(cands.len());
        let mut cum = 0.0f64;
        let mut scanned = 0usize;
        loop {
            cands.sort_prefix(k);
            for (i, c) in cands.as_slice()[scanned..k].iter().enumerate() {
                cum += weight(c.logit, max);
                if cum >= target {
                    cands.truncate(scanned + i + 1);
                    return;
                }
            }
            if k == cands.len() {
                // Rounding left the sum a hair short of p: keep everything.
                return;
            }
            scanned = k;
            k = k.saturating_mul(8).min(cands.len());
        }
    }
}
