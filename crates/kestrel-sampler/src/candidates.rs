//! The candidates list every processor works on.

use std::cmp::Ordering;

/// One token still in the running, with its (possibly processed) logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Token id.
    pub id: u32,
    /// Logit; never NaN (NaN inputs become `-inf`).
    pub logit: f32,
}

/// Descending logit, ties broken to the lowest id. Total (no NaN panics).
pub(crate) fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// What [`top_k_into`] reads: a list of logits by position, as raw logits (ids are the
/// positions) or as candidates.
pub(crate) trait Scores {
    fn count(&self) -> usize;
    /// The candidate at position `i` (NaN as `-inf`).
    fn at(&self, i: usize) -> Candidate;
    /// The largest logit of positions `range`, NaN ignored.
    fn max_of(&self, range: std::ops::Range<usize>) -> f32;
    /// Whether ids grow with the position: a later token then loses every tie.
    const IDS_ASCEND: bool;
}

impl Scores for [f32] {
    fn count(&self) -> usize {
        self.len()
    }
    fn at(&self, i: usize) -> Candidate {
        let l = self[i];
        Candidate {
            id: i as u32,
            logit: if l.is_nan() { f32::NEG_INFINITY } else { l },
        }
    }
    fn max_of(&self, range: std::ops::Range<usize>) -> f32 {
        max_ignoring_nan(&self[range])
    }
    const IDS_ASCEND: bool = true;
}

impl Scores for [Candidate] {
    fn count(&self) -> usize {
        self.len()
    }
    fn at(&self, i: usize) -> Candidate {
        self[i]
    }
    fn max_of(&self, range: std::ops::Range<usize>) -> f32 {
        // gathered into a block, so the max vectorizes
        let mut block = [f32::NEG_INFINITY; TOP_CHUNK];
        let part = &self[range];
        for (b, c) in block.iter_mut().zip(part) {
            *b = c.logit;
        }
        max_ignoring_nan(&block[..part.len()])
    }
    const IDS_ASCEND: bool = false;
}

/// A logit's bits as a key that ascends as the logit falls (best first): the order of
/// [`by_logit_desc`] but for ties; [`unkey`] undoes it.
fn order_key(logit: f32) -> u32 {
    let b = logit.to_bits();
    !(if b >> 31 == 1 { !b } else { b | 0x8000_0000 })
}

fn unkey(k: u32) -> f32 {
    let a = !k;
    f32::from_bits(if a >> 31 == 1 { a & 0x7FFF_FFFF } else { !a })
}

/// The first bucket of `hist` (masses, best first) where the running mass reaches `need`,
/// and the mass before it; `None` where the whole falls short.
fn cut_bucket(hist: &[f64], need: f64) -> Option<(u32, f64)> {
    let mut before = 0.0f64;
    for (b, &m) in hist.iter().enumerate() {
        if before + m >= need {
            return Some((b as u32, before));
        }
        before += m;
    }
    None
}

/// Positions [`top_k_into`] passes over at once by their maximum.
const TOP_CHUNK: usize = 128;

/// Collects the `k` best of `items` that `skip` does not exclude into `buf`, sorted (ties to
/// the lowest id). One pass: candidates that beat the current k-th best go into a buffer of
/// `2k`, compacted to the best `k` whenever it fills, so the cost is O(n) even for
/// adversarial orders; once `k` are held, a chunk of 128 whose maximum cannot beat the k-th
/// is passed over whole (a vectorized max, not a comparison a token: on a real vocabulary
/// almost every chunk is).
pub(crate) fn top_k_into<S: Scores + ?Sized>(
    items: &S,
    k: usize,
    skip: impl Fn(u32) -> bool,
    buf: &mut Vec<Candidate>,
) {
    buf.clear();
    if k == 0 {
        return;
    }
    buf.reserve(2 * k);
    let n = items.count();
    let mut kth: Option<Candidate> = None;
    for start in (0..n).step_by(TOP_CHUNK) {
        let end = (start + TOP_CHUNK).min(n);
        if let Some(t) = &kth {
            let m = items.max_of(start..end);
            // a later token loses a tie where ids ascend, so equal is not enough there
            if m < t.logit || (S::IDS_ASCEND && m == t.logit) {
                continue;
            }
        }
        for i in start..end {
            let c = items.at(i);
            if kth.is_some_and(|t| c.logit < t.logit || by_logit_desc(&c, &t).is_ge()) {
                continue;
            }
            if skip(c.id) {
                continue;
            }
            buf.push(c);
            if buf.len() == 2 * k {
                buf.select_nth_unstable_by(k - 1, by_logit_desc);
                buf.truncate(k);
                kth = Some(buf[k - 1]);
            }
        }
    }
    if buf.len() > k {
        buf.select_nth_unstable_by(k - 1, by_logit_desc);
        buf.truncate(k);
    }
    buf.sort_unstable_by(by_logit_desc);
}

/// The largest of `xs`, NaN ignored (`-inf` when there is none); sixteen lanes, so it
/// vectorizes.
pub(crate) fn max_ignoring_nan(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if xs.len() >= 1024 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { max_avx2(xs) };
    }
    max_body(xs)
}

/// [`max_body`] in 8-wide vectors (a max is exact: the same result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_avx2(xs: &[f32]) -> f32 {
    max_body(xs)
}

#[inline(always)]
fn max_body(xs: &[f32]) -> f32 {
    // `x > m` is false for a NaN x: one vector max a block (x86's max keeps m then)
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut blocks = xs.chunks_exact(LANES);
    for b in &mut blocks {
        for (m, &x) in lanes.iter_mut().zip(b) {
            if x > *m {
                *m = x;
            }
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(blocks.remainder()) {
        if x > m {
            m = x;
        }
    }
    m
}

/// The largest logit of `cands` (`-inf` when empty): blocks of logits gathered for a
/// vectorized max (a list of the whole vocabulary).
pub(crate) fn max_of(cands: &[Candidate]) -> f32 {
    let mut block = [f32::NEG_INFINITY; 64];
    cands
        .chunks(block.len())
        .map(|chunk| {
            for (b, c) in block.iter_mut().zip(chunk) {
                *b = c.logit;
            }
            max_ignoring_nan(&block[..chunk.len()])
        })
        .fold(f32::NEG_INFINITY, f32::max)
}

/// A list of candidates, reusable across calls.
///
/// It remembers how long a prefix is already sorted (by descending logit,
/// ties to the lowest id) and holds the top elements, so processors can
/// sort only as far as they need to.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    data: Vec<Candidate>,
    /// `data[..sorted]` holds the `sorted` best candidates, in order.
    sorted: usize,
    /// Reusable buffer of [`Candidates::best`].
    spare: Vec<Candidate>,
}

impl Candidates {
    /// An empty list with room for `n` candidates.
    pub fn with_capacity(n: usize) -> Self {
        Candidates {
            data: Vec::with_capacity(n),
            sorted: 0,
            spare: Vec::new(),
        }
    }

    /// A new list from raw logits (see [`Candidates::fill`]).
    pub fn from_logits(logits: &[f32]) -> Self {
        let mut c = Candidates::with_capacity(logits.len());
        c.fill(logits);
        c
    }

    /// Replaces the contents with one candidate per logit, in id order,
    /// reusing the buffer. NaN logits become `-inf`.
    pub fn fill(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: if l.is_nan() { f32::NEG_INFINITY } else { l },
            }));
        self.sorted = 0;
    }

    /// Replaces the contents with the `k` best candidates of `logits` whose ids are not in
    /// `penalized`, sorted, followed by `penalized` itself (`(id, logit)` sorted by id: the
    /// tokens whose logits the penalties changed, with the changed logits). A top-k (or
    /// argmax) of this list keeps what it would keep of [`Candidates::fill`]'s list with the
    /// penalties applied: any other token has `k` unpenalized ones ahead of it. One fast pass
    /// over the logits, no candidate written per vocabulary entry.
    pub fn fill_top(&mut self, logits: &[f32], k: usize, penalized: &[(u32, f32)]) {
        let skip = |id: u32| penalized.binary_search_by_key(&id, |p| p.0).is_ok();
        top_k_into(logits, k, skip, &mut self.data);
        self.sorted = self.data.len();
        if !penalized.is_empty() {
            self.data
                .extend(penalized.iter().map(|&(id, logit)| Candidate { id, logit }));
            self.sorted = 0;
        }
    }

    /// The candidates in their current order.
    pub fn as_slice(&self) -> &[Candidate] {
        &self.data
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether no candidate is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Whether the whole list is sorted by descending logit.
    pub fn is_sorted(&self) -> bool {
        self.sorted == self.data.len()
    }

    /// Token ids in current order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.data.iter().map(|c| c.id)
    }

    /// The candidate for token `id`, if still present.
    pub fn get(&self, id: u32) -> Option<&Candidate> {
        self.position(id).map(|i| &self.data[i])
    }

    /// Largest logit (`-inf` when empty).
    pub fn max_logit(&self) -> f32 {
        if self.sorted > 0 {
            return self.data[0].logit;
        }
        max_of(&self.data)
    }

    fn position(&self, id: u32) -> Option<usize> {
        // Fast path: a freshly filled list is indexed by id.
        let i = id as usize;
        if self.data.get(i).is_some_and(|c| c.id == id) {
            return Some(i);
        }
        self.data.iter().position(|c| c.id == id)
    }

    /// Mutable access to token `id`'s logit; forgets the sort order.
    pub(crate) fn logit_mut(&mut self, id: u32) -> Option<&mut f32> {
        let i = self.position(id)?;
        self.sorted = 0;
        Some(&mut self.data[i].logit)
    }

    /// Applies `f` to every logit. `f` must be non-decreasing so the sort
    /// order stays valid (e.g. division by a positive temperature).
    pub(crate) fn map_logits_monotone(&mut self, f: impl Fn(f32) -> f32) {
        for c in &mut self.data {
            c.logit = f(c.logit);
        }
    }

    /// The `k` best candidates, sorted (ties to the lowest id), the list itself unchanged:
    /// its sorted prefix where that is long enough, else one pass of [`top_k_into`] into a
    /// buffer (so a top-p over a whole vocabulary sorts nothing but what it keeps).
    pub(crate) fn best(&mut self, k: usize) -> &[Candidate] {
        let k = k.min(self.data.len());
        if k <= self.sorted {
            return &self.data[..k];
        }
        top_k_into(&self.data[..], k, |_| false, &mut self.spare);
        &self.spare
    }

    /// Keeps only the `n` best candidates, sorted; `n` at most the `k` of the last
    /// [`Candidates::best`].
    pub(crate) fn keep_best(&mut self, n: usize) {
        if n <= self.sorted {
            self.truncate(n);
            return;
        }
        // copied back (n is small) so `data` keeps its vocabulary-sized buffer
        self.data.clear();
        self.data.extend_from_slice(&self.spare[..n]);
        self.sorted = n;
    }

    /// Keeps the smallest set of best candidates (in [`by_logit_desc`] order) whose weights
    /// `weight(logit, max)` add up to at least `target`, in list order (not sorted); all of
    /// them where even the whole list falls short (rounding). A radix selection on the logits'
    /// bits (an order-keeping key, best first): one pass sums the weights by the key's top 11
    /// bits, the bucket that holds the cut is split by the next 11 and then the last 10, and
    /// ties in the final key go to the lowest ids; one more pass keeps what lies before the
    /// cut. A nucleus of most of a flat 152k vocabulary then costs a few passes instead of a
    /// sort of the whole list (~10 ms a token before).
    pub(crate) fn keep_mass(&mut self, target: f64, max: f32) {
        use crate::weights::weight;
        let key = |c: &Candidate| order_key(c.logit);
        let data = &self.data;
        // every candidate's weight, 1,024 at a time (vectorized), summed by the key's top bits
        // (four histograms taken in turn: a flat list puts run after run of candidates in
        // one bucket, and one histogram would chain each add on the one before)
        let (mut logits, mut w) = ([0f32; 1024], [0f32; 1024]);
        let mut tops = vec![[0f64; 2048]; 4];
        let mut counts = vec![0u32; 2048];
        for part in data.chunks(logits.len()) {
            for (l, c) in logits.iter_mut().zip(part) {
                *l = c.logit;
            }
            crate::weights::weights_into(&logits[..part.len()], max, &mut w);
            for (i, (c, &wi)) in part.iter().zip(&w).enumerate() {
                let b = (key(c) >> 21) as usize;
                tops[i & 3][b] += f64::from(wi);
                counts[b] += 1;
            }
        }
        let top: Vec<f64> = (0..2048)
            .map(|b| (tops[0][b] + tops[1][b]) + (tops[2][b] + tops[3][b]))
            .collect();
        let Some((b1, m1)) = cut_bucket(&top, target) else {
            return; // rounding left the whole list a hair short: keep everything
        };
        // the bucket's members (each candidate written to the next free slot, which only a
        // member keeps: no branch a candidate), narrowed by the next 11 bits, then the last 10
        let count = counts[b1 as usize] as usize;
        let mut slots = vec![(0u32, 0u32); count + 1];
        let mut n = 0;
        for c in data {
            let k = key(c);
            slots[n] = (k, c.id);
            n = (n + usize::from(k >> 21 == b1)).min(count);
        }
        let mut members: Vec<(u32, u32, f64)> = slots[..count]
            .iter()
            .map(|&(k, id)| (k, id, weight(unkey(k), max)))
            .collect();
        let mut need = target - m1;
        let mut whole = false; // the cut past the narrowed bucket (rounding): keep it whole
        for shift in [10u32, 0] {
            let mut hist = [0f64; 2048];
            for &(k, _, w) in &members {
                hist[((k >> shift) & 0x7FF) as usize] += w;
            }
            match cut_bucket(&hist, need) {
                Some((b, m)) => {
                    need -= m;
                    members.retain(|&(k, _, _)| (k >> shift) & 0x7FF == b);
                }
                None => {
                    whole = true;
                    break;
                }
            }
        }
        // members now share one key (equal logits) unless `whole`: the lowest ids first
        members.sort_unstable_by_key(|&(k, id, _)| (k, id));
        let mut cum = 0.0f64;
        let cut = if whole {
            None
        } else {
            members.iter().position(|&(_, _, w)| {
                cum += w;
                cum >= need
            })
        };
        let (cut_key, last) = match cut {
            Some(i) => (members[i].0, members[i].1),
            None => members.last().map_or((0, 0), |m| (m.0, u32::MAX)),
        };
        // (every candidate written, the count moved by whether it stays: no branch a token)
        let mut kept = 0;
        for i in 0..self.data.len() {
            let c = self.data[i];
            let k = key(&c);
            self.data[kept] = c;
            kept += usize::from(k < cut_key || (k == cut_key && c.id <= last));
        }
        self.data.truncate(kept);
        self.sorted = 0;
    }

    /// Keeps only the `k` best candidates, sorted, in one pass over the list (see
    /// [`top_k_into`]); no sort of the whole list.
    pub(crate) fn keep_top(&mut self, k: usize) {
        let n = self.best(k).len();
        self.keep_best(n);
    }

    /// Keeps the first `n` candidates.
    pub(crate) fn truncate(&mut self, n: usize) {
        self.data.truncate(n);
        self.sorted = self.sorted.min(self.data.len());
    }

    /// Keeps the candidates whose logit is `>= threshold`, preserving order.
    pub(crate) fn retain_at_least(&mut self, threshold: f32) {
        let sorted = self.sorted;
        let mut kept_sorted = 0;
        let mut w = 0;
        for r in 0..self.data.len() {
            let c = self.data[r];
            if c.logit >= threshold {
                self.data[w] = c;
                w += 1;
                if r < sorted {
                    kept_sorted += 1;
                }
            }
        }
        self.data.truncate(w);
        // A threshold keeps a prefix of the sorted prefix; if it cut into
        // that prefix, everything after it was below the cut as well.
        self.sorted = kept_sorted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_becomes_neg_inf() {
        let c = Candidates::from_logits(&[1.0, f32::NAN, 2.0]);
        assert_eq!(c.as_slice()[1].logit, f32::NEG_INFINITY);
        assert_eq!(c.max_logit(), 2.0);
    }

    /// `keep_mass` keeps a prefix of the full sort whose mass reaches the target and that
    /// loses it without its last member (within the rounding of summing in another order),
    /// on flat, peaked and tied lists in scrambled orders, with `-inf` among them.
    #[test]
    fn keep_mass_keeps_the_prefix_of_the_full_sort_that_reaches_the_mass() {
        let n = 30_000u64;
        let lists: Vec<Vec<f32>> = vec![
            vec![0.0; n as usize],
            (0..n)
                .map(|i| ((i * 2_654_435_761) % 10_007) as f32 * 1e-4)
                .collect(),
            (0..n)
                .map(|i| ((i * 7919) % 10_007) as f32 * 2e-3)
                .collect(),
            (0..n)
                .map(|i| match (i * 2_654_435_761) % 97 {
                    0 => f32::NEG_INFINITY,
                    v => (v % 40) as f32 * 0.25,
                })
                .collect(),
        ];
        for logits in &lists {
            let mut sorted = Candidates::from_logits(logits);
            sorted.data.sort_by(by_logit_desc);
            let max = sorted.data[0].logit;
            let w: Vec<f64> = sorted
                .data
                .iter()
                .map(|c| crate::weights::weight(c.logit, max))
                .collect();
            let total: f64 = w.iter().sum();
            for p in [1e-6, 0.1, 0.5, 0.8, 0.95, 0.999, 1.0, 1.5] {
                let target = p * total;
                let mut c = Candidates::from_logits(logits);
                c.keep_mass(target, max);
                let kept = c.len();
                let mut got: Vec<u32> = c.ids().collect();
                got.sort_unstable();
                let mut want: Vec<u32> = sorted.data[..kept].iter().map(|c| c.id).collect();
                want.sort_unstable();
                assert_eq!(got, want, "p {p}: not the best {kept}");
                let mass: f64 = w[..kept].iter().sum();
                let eps = 1e-9 * total;
                if p <= 1.0 {
                    assert!(mass + eps >= target, "p {p}: mass {mass} short of {target}");
                    assert!(
                        mass - w[kept - 1] < target + eps,
                        "p {p}: {kept} kept, fewer reach it"
                    );
                } else {
                    assert_eq!(
                        kept,
                        logits.len(),
                        "a target past the total keeps everything"
                    );
                }
            }
        }
    }

    #[test]
    fn keep_top_matches_full_sort_on_any_order() {
        let shuffled: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 5000) as f32).collect();
        let ascending: Vec<f32> = (0..5000).map(|i| i as f32).collect();
        let ties = vec![1.0f32; 5000];
        for logits in [shuffled, ascending, ties] {
            for k in [1, 2, 40, 1000, 4999] {
                let mut c = Candidates::from_logits(&logits);
                c.keep_top(k);
                let mut want = Candidates::from_logits(&logits);
                want.data.sort_by(by_logit_desc);
                want.data.truncate(k);
                assert_eq!(c.as_slice(), want.as_slice());
                assert!(c.is_sorted());
            }
        }
    }

    #[test]
    fn the_best_of_a_large_list_with_ties_are_the_full_sort_s() {
        // values on a coarse grid (many ties), -inf among them, in a scrambled order
        let logits: Vec<f32> = (0..20_000u64)
            .map(|i| match (i * 2_654_435_761) % 97 {
                0 => f32::NEG_INFINITY,
                v => (v % 40) as f32 * 0.5,
            })
            .collect();
        let mut want = Candidates::from_logits(&logits);
        want.data.sort_by(by_logit_desc);
        let mut c = Candidates::from_logits(&logits);
        for k in [1, 64, 512, 4096, 20_000] {
            assert_eq!(c.best(k), &want.as_slice()[..k], "best {k}");
            assert_eq!(c.len(), 20_000, "the list itself unchanged");
        }
        c.best(512);
        c.keep_best(100);
        assert_eq!(c.as_slice(), &want.as_slice()[..100]);
        assert!(c.is_sorted());
        assert_eq!(c.best(10), &want.as_slice()[..10], "from the sorted prefix");
    }
}
