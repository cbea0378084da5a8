//! The short causal convolution in front of the delta rule: each channel convolved with its
//! own `K` taps over the last `K` inputs, then SiLU. The inputs before the step come from the
//! window kept in the recurrent state, which is updated to the step's last `K - 1` inputs, so a
//! prompt run in one prefill or token by token gives the same result.

/// `out[t, c] = silu(sum_j taps[j, c] * x[t - (K-1) + j, c])`, with `x` of negative index read
/// from `window` (`[K-1, C]`, oldest first); `window` then holds the last `K - 1` inputs.
///
/// `x`, `out`: `[T, C]`; `taps`: `[K, C]` (tap-major, so the inner loop runs along channels).
pub fn causal_conv_silu(x: &[f32], taps: &[f32], c: usize, window: &mut [f32], out: &mut [f32]) {
    let t_len = x.len() / c;
    conv_silu_rows(x, taps, c, window, out, 0..t_len);
    slide_window(x, c, window);
}

/// The outputs of tokens `rows` only (`out`: those rows, `[rows.len(), C]`), reading `window`
/// without changing it, so token ranges can run as separate tasks; [`slide_window`] after.
pub fn conv_silu_rows(
    x: &[f32],
    taps: &[f32],
    c: usize,
    window: &[f32],
    out: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    for (i, t) in rows.enumerate() {
        conv_silu_channels(x, taps, c, window, &mut out[i * c..(i + 1) * c], t, 0..c);
    }
}

/// Token `t`'s outputs for channels `chans` only (`out`: `chans.len()` values), so one token's
/// channels can run as separate tasks (decode); the window is read, not changed.
pub fn conv_silu_channels(
    x: &[f32],
    taps: &[f32],
    c: usize,
    window: &[f32],
    out: &mut [f32],
    t: usize,
    chans: std::ops::Range<usize>,
) {
    let k = taps.len() / c;
    let hist = k - 1;
    debug_assert_eq!(window.len(), hist * c);
    // The input at time t - hist + j: from the window for negative times, else from x.
    let input = |tt: isize| -> &[f32] {
        if tt < 0 {
            let r = (hist as isize + tt) as usize;
            &window[r * c..(r + 1) * c]
        } else {
            let r = tt as usize;
            &x[r * c..(r + 1) * c]
        }
    };
    let acc = &mut out[..chans.len()];
    acc.fill(0.0);
    for j in 0..k {
        let src = &input(t as isize - hist as isize + j as isize)[chans.clone()];
        let w = &taps[j * c..(j + 1) * c][chans.clone()];
        for ((a, &wv), &xv) in acc.iter_mut().zip(w).zip(src) {
            *a += wv * xv;
        }
    }
    for a in acc.iter_mut() {
        *a = silu(*a);
    }
}

/// Slides the window over `x` (`[T, C]`): it keeps the last `K - 1` inputs of (window ++ x).
pub fn slide_window(x: &[f32], c: usize, window: &mut [f32]) {
    let t_len = x.len() / c;
    let hist = window.len() / c;
    if t_len >= hist {
        window.copy_from_slice(&x[(t_len - hist) * c..t_len * c]);
    } else {
        window.copy_within(t_len * c.., 0);
        let keep = (hist - t_len) * c;
        window[keep..].copy_from_slice(x);
    }
}

#[inline]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct form over the whole sequence with zero history.
    fn direct(x: &[f32], taps: &[f32], c: usize, k: usize) -> Vec<f32> {
        let t_len = x.len() / c;
        let mut out = vec![0f32; x.len()];
        for t in 0..t_len {
            for ch in 0..c {
                let mut s = 0f32;
                for j in 0..k {
                    let tt = t as isize - (k - 1) as isize + j as isize;
                    if tt >= 0 {
                        s += taps[j * c + ch] * x[tt as usize * c + ch];
                    }
                }
                out[t * c + ch] = silu(s);
            }
        }
        out
    }

    #[test]
    fn stepwise_equals_whole_sequence() {
        let (c, k, t_len) = (5, 4, 9);
        let x: Vec<f32> = (0..c * t_len)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let taps: Vec<f32> = (0..c * k)
            .map(|i| ((i * 5 % 9) as f32 - 4.0) / 4.0)
            .collect();
        let want = direct(&x, &taps, c, k);
        // whole sequence at once
        let mut window = vec![0f32; (k - 1) * c];
        let mut out = vec![0f32; x.len()];
        causal_conv_silu(&x, &taps, c, &mut window, &mut out);
        assert_eq!(out, want);
        // in pieces of 1, 2 and 6 tokens
        let mut window2 = vec![0f32; (k - 1) * c];
        let mut got = Vec::new();
        for (a, b) in [(0, 1), (1, 3), (3, 9)] {
            let mut o = vec![0f32; (b - a) * c];
            causal_conv_silu(&x[a * c..b * c], &taps, c, &mut window2, &mut o);
            got.extend(o);
        }
        assert_eq!(got, want);
        assert_eq!(window, window2);
        // rows in two ranges, then the window slid
        let mut window3 = vec![0f32; (k - 1) * c];
        let mut got3 = vec![0f32; x.len()];
        let (a, b) = got3.split_at_mut(4 * c);
        conv_silu_rows(&x, &taps, c, &window3, a, 0..4);
        conv_silu_rows(&x, &taps, c, &window3, b, 4..t_len);
        slide_window(&x, c, &mut window3);
        assert_eq!(got3, want);
        assert_eq!(window3, window);
        // one token's channels in two ranges
        let window4 = vec![0f32; (k - 1) * c];
        for t in 0..t_len {
            let mut o = vec![0f32; c];
            let (lo, hi) = o.split_at_mut(2);
            conv_silu_channels(&x, &taps, c, &window4, lo, t, 0..2);
            conv_silu_channels(&x, &taps, c, &window4, hi, t, 2..c);
            assert_eq!(o, want[t * c..(t + 1) * c]);
        }
    }
}
