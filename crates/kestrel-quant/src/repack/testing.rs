//! Test data for the layouts' tests: random matrices as a file stores them, random activation
//! rows, and the row round trip every layout must pass.

use crate::GgmlType;

/// xorshift64: the same sequence on every run.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn values(&mut self, n: usize, div: f32, lo: f32) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next() % 2001) as f32 / div + lo)
            .collect()
    }

    /// `rows` rows of `cols` values in [-1, 1] quantized to `ty`, row-major, and the row size.
    pub(crate) fn matrix(&mut self, ty: GgmlType, rows: usize, cols: usize) -> (Vec<u8>, usize) {
        let x = self.values(rows * cols, 1000.0, -1.0);
        let rb = crate::row_bytes(ty, cols).unwrap();
        let mut w = vec![0u8; rows * rb];
        for (src, dst) in x.chunks_exact(cols).zip(w.chunks_exact_mut(rb)) {
            crate::quantize_row(ty, src, dst).unwrap();
        }
        (w, rb)
    }

    /// `t` activation rows of `cols` values in [-1.4, 1.46] quantized as a matmul does (`ty`).
    pub(crate) fn acts(&mut self, ty: GgmlType, t: usize, cols: usize) -> Vec<u8> {
        let ab = crate::row_bytes(ty, cols).unwrap();
        let mut acts = vec![0u8; t * ab];
        for dst in acts.chunks_exact_mut(ab) {
            let y = self.values(cols, 700.0, -1.4);
            crate::quantize_activation_row(ty, &y, dst).unwrap();
        }
        acts
    }
}

/// Every row of a repacked matrix comes back as the file's bytes (`native_row(r, out)`).
pub(crate) fn assert_rows_round_trip(w: &[u8], rb: usize, native_row: impl Fn(usize, &mut [u8])) {
    for (r, file_row) in w.chunks_exact(rb).enumerate() {
        let mut native = vec![0u8; rb];
        native_row(r, &mut native);
        assert_eq!(native, file_row, "row {r}");
    }
}

/// The SIMD results `got` (`[t][16]`) equal the scalar form `want` bit for bit, and the
/// row-major kernels' `row_major` (`[16][t]`) too where those run their AVX-512 (llama.cpp)
/// order; elsewhere they agree to 1e-3.
pub(crate) fn assert_same_results(
    got: &[f32],
    want: &[f32],
    row_major: &[f32],
    t: usize,
    what: &str,
) {
    let avx512 = crate::cpu::Backend::detect() == crate::cpu::Backend::Avx512Vnni;
    for c in 0..t {
        for r in 0..super::R {
            let (a, b, m) = (
                got[c * super::R + r],
                want[c * super::R + r],
                row_major[r * t + c],
            );
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{what}: simd vs scalar, token {c} row {r}"
            );
            if avx512 {
                assert_eq!(
                    a.to_bits(),
                    m.to_bits(),
                    "{what}: vs row-major {a} {m}, token {c} row {r}"
                );
            } else {
                assert!(
                    (a - m).abs() <= 1e-3 * (1.0 + m.abs()),
                    "{what}: {a} vs {m}"
                );
            }
        }
    }
}
