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
