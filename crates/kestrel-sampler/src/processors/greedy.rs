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

/// [`argmax`] over raw logits (NaN counts as `-inf`, as in a candidate list): the same pick.
pub fn argmax_logits(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (id, &l) in logits.iter().enumerate() {
        let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((id as u32, l));
        }
    }
    best.map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_over_logits_picks_as_the_candidate_list_does() {
        let nan = f32::NAN;
        let ninf = f32::NEG_INFINITY;
        let cases: [&[f32]; 6] = [
            &[],
            &[0.5],
            &[1.0, 3.0, 3.0, 2.0],
            &[nan, -1.0, nan],
            &[nan, nan],
            &[ninf, ninf, -5.0, ninf],
        ];
        for logits in cases {
            let mut c = Candidates::with_capacity(logits.len());
            c.fill(logits);
            assert_eq!(argmax_logits(logits), argmax(&c), "{logits:?}");
        }
        assert_eq!(
            argmax_logits(&[1.0, 3.0, 3.0, 2.0]),
            Some(1),
            "ties: the lowest id"
        );
    }
}
