//! Temperature scaling.

use crate::Candidates;

/// Divides every logit by the temperature. Temperatures `<= 0` (greedy) and
/// `1` leave the logits alone; greedy is handled by the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Temperature(pub f32);

impl Temperature {
    /// Applies the scaling.
    pub fn apply(&self, cands: &mut Candidates) {
        let t = self.0;
        if t.is_nan() || t <= 0.0 || t == 1.0 {
            return;
        }
        let inv = 1.0 / t;
        cands.map_logits_monotone(|l| l * inv);
    }
}
