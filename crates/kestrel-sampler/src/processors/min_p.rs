//! Min-p filter.

use crate::Candidates;

/// Drops candidates whose probability is below `min_p × p_max`, i.e. whose
/// logit is below `max_logit + ln(min_p)`. `0` disables. Order is kept and
/// the most likely candidate always survives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinP(pub f32);

impl MinP {
    /// Applies the filter.
    pub fn apply(&self, cands: &mut Candidates) {
        let m = self.0;
        if m.is_nan() || m <= 0.0 || cands.len() <= 1 {
            return;
        }
        let max = cands.max_logit();
        if max.is_infinite() {
            // All impossible, or the infinite ones are the only possible ones
            // (dist handles that); nothing meaningful to cut.
            return;
        }
        let threshold = max + m.ln();
        cands.retain_at_least(threshold);
    }
}
