//! Top-k filter.

use crate::Candidates;

/// Keeps the `k` highest logits (ties to the lowest id); `0` disables.
///
/// One linear pass (or a partial select for large k), never a full sort.
/// The kept candidates end up sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopK(pub usize);

impl TopK {
    /// Applies the filter.
    pub fn apply(&self, cands: &mut Candidates) {
        let k = self.0;
        if k == 0 || k >= cands.len() {
            return;
        }
        cands.keep_top(k);
    }
}
