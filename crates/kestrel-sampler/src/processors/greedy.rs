//! Greedy pick.

use crate::Candidates;

/// The candidate with the highest logit, ties broken to the lowest id;
/// `None` when the list is empty.
pub fn argmax(cands: &Candidates) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for c in cands.as_slice() {
        best = match best {
            Some((id, l)) if l > c.logit || (l == c.logit && id < c.id) => Some((id, l)),
            _ => Some((c.id, c.logit)),
        };
    }
    best.map(|(id, _)| id)
}
