//! Greedy pick.

use crate::candidates::max_ignoring_nan;
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
///
/// Two passes, both vector-friendly: the maximum of each 1024-logit chunk (16 lanes of
/// compare-and-keep, which ignores NaN), then the first position of the overall maximum inside
/// the first chunk that holds it. A 248k vocabulary is read once instead of walked with a
/// branch per logit (this runs once per sequence and decode step).
pub fn argmax_logits(logits: &[f32]) -> Option<u32> {
    const CHUNK: usize = 1024;
    if logits.is_empty() {
        return None;
    }
    let (mut best, mut best_chunk) = (f32::NEG_INFINITY, 0);
    for (c, chunk) in logits.chunks(CHUNK).enumerate() {
        let m = max_ignoring_nan(chunk);
        if m > best {
            (best, best_chunk) = (m, c);
        }
    }
    if best == f32::NEG_INFINITY {
        // every logit -inf or NaN: all tie at -inf, the lowest id wins
        return Some(0);
    }
    let base = best_chunk * CHUNK;
    let at = logits[base..].iter().position(|&x| x == best)?;
    Some((base + at) as u32)
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

    #[test]
    fn chunked_argmax_equals_the_plain_scan_on_a_large_vocabulary() {
        // The one-pass definition: the first strictly greater logit wins, NaN as -inf.
        let plain = |xs: &[f32]| {
            let mut c = Candidates::with_capacity(xs.len());
            c.fill(xs);
            argmax(&c)
        };
        let mut x = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in [1usize, 15, 16, 17, 1023, 1024, 1025, 5000, 151_936] {
            let mut v: Vec<f32> = (0..n)
                .map(|_| (next() % 2000) as f32 / 100.0 - 10.0)
                .collect();
            assert_eq!(argmax_logits(&v), plain(&v), "n {n}");
            // a tie of the maximum in two chunks, NaNs and -inf sprinkled in
            let top = 25.0;
            let (a, b) = ((next() as usize) % n, (next() as usize) % n);
            v[a] = top;
            v[b] = top;
            for _ in 0..n / 50 {
                let i = (next() as usize) % n;
                if i != a && i != b {
                    v[i] = if next() % 2 == 0 {
                        f32::NAN
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
            assert_eq!(
                argmax_logits(&v),
                Some(a.min(b) as u32),
                "n {n}: the first of the tie"
            );
            assert_eq!(argmax_logits(&v), plain(&v), "n {n}");
        }
    }
}
