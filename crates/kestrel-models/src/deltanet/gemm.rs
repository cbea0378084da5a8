//! A small f64 matrix product for the chunked delta rule: `C += alpha A B` with row-major
//! operands and leading dimensions, blocked 4 rows x 16 columns so the accumulators stay in
//! registers (a row update, `axpy`, loads and stores its target once per multiply-add; this
//! loads each `B` row once per 4 rows of `C`). `#[inline(always)]`: it takes the vector width
//! of the multiversioned caller (rule.rs). Plain multiply and add, a fixed order of sums.

/// Rows and columns of one register block.
const MR: usize = 4;
const NR: usize = 16;

/// One operand: `data[i * ld + j]` is element (i, j).
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f64],
    pub ld: usize,
}

/// `C[m x n] += alpha * A[m x k] * B[k x n]`; `c` with leading dimension `ldc`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_acc(
    m: usize,
    n: usize,
    k: usize,
    alpha: f64,
    a: Mat,
    b: Mat,
    c: &mut [f64],
    ldc: usize,
) {
    let mut i = 0;
    while i < m {
        let rows = (m - i).min(MR);
        let mut j = 0;
        while j + NR <= n {
            if rows == MR {
                block::<MR>(i, j, k, alpha, a, b, c, ldc);
            } else {
                for r in 0..rows {
                    block::<1>(i + r, j, k, alpha, a, b, c, ldc);
                }
            }
            j += NR;
        }
        // the last n % NR columns, one at a time
        for r in i..i + rows {
            for jj in j..n {
                let mut acc = 0f64;
                for p in 0..k {
                    acc += a.data[r * a.ld + p] * b.data[p * b.ld + jj];
                }
                c[r * ldc + jj] += alpha * acc;
            }
        }
        i += rows;
    }
}

/// `R` rows x `NR` columns of C at (i, j).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block<const R: usize>(
    i: usize,
    j: usize,
    k: usize,
    alpha: f64,
    a: Mat,
    b: Mat,
    c: &mut [f64],
    ldc: usize,
) {
    let mut acc = [[0f64; NR]; R];
    for p in 0..k {
        let brow: &[f64; NR] = b.data[p * b.ld + j..p * b.ld + j + NR]
            .try_into()
            .expect("NR columns");
        for (r, row) in acc.iter_mut().enumerate() {
            let av = a.data[(i + r) * a.ld + p];
            for (x, &bv) in row.iter_mut().zip(brow) {
                *x += av * bv;
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        let dst = &mut c[(i + r) * ldc + j..(i + r) * ldc + j + NR];
        for (d, &x) in dst.iter_mut().zip(row) {
            *d += alpha * x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_the_plain_triple_loop_on_ragged_shapes() {
        for (m, n, k) in [
            (7, 37, 5),
            (4, 16, 1),
            (1, 128, 64),
            (64, 64, 128),
            (3, 5, 9),
        ] {
            let a: Vec<f64> = (0..m * (k + 2))
                .map(|i| ((i * 7 % 13) as f64 - 6.0) / 7.0)
                .collect();
            let b: Vec<f64> = (0..k * (n + 3))
                .map(|i| ((i * 5 % 11) as f64 - 5.0) / 3.0)
                .collect();
            let (lda, ldb, ldc) = (k + 2, n + 3, n + 1);
            let mut c: Vec<f64> = (0..m * ldc).map(|i| i as f64 * 0.01).collect();
            let mut want = c.clone();
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k).map(|p| a[i * lda + p] * b[p * ldb + j]).sum();
                    want[i * ldc + j] += -0.5 * s;
                }
            }
            let (am, bm) = (Mat { data: &a, ld: lda }, Mat { data: &b, ld: ldb });
            gemm_acc(m, n, k, -0.5, am, bm, &mut c, ldc);
            let err = c
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0f64, f64::max);
            assert!(err < 1e-12, "({m}, {n}, {k}): {err}");
        }
    }
}
