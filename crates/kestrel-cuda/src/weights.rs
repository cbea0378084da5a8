//! Weights in device memory, in the layout the kernels read (kernels/matvec.cu):
//! - F32, F16, Q4_K, Q5_K: the GGUF bytes as they are (a Q4_K block is 144 bytes, a Q5_K block
//!   176, so every block starts 16-byte aligned);
//! - Q6_K (210 bytes), Q8_0 (34), Q4_0 (18), Q5_0 (22): the f16 scale of each block moves to a
//!   plane after all blocks; Q4_1 (20) and Q5_1 (24): the scale and the min, one 4-byte word a
//!   block. The payloads are then 16- (Q6_K, Q8_0, Q4_0, Q4_1) or 4-byte (Q5_0, Q5_1) aligned
//!   and read with wide loads. Same bytes in all, no padding.

use crate::device::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
use kestrel_gguf::GgmlType;
use kestrel_models::weights::Weight;

/// Weight types the kernels read; the numbers are the kernels' `T_*` constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q5_0 = 3,
    Q8_0 = 4,
    Q4K = 5,
    Q6K = 6,
    Q4_1 = 7,
    Q5_1 = 8,
    Q5K = 9,
}

impl Kind {
    /// The quantized kinds (int8 activations), as the op harness and tests walk them.
    pub const QUANTIZED: [Kind; 8] = [
        Kind::Q4K,
        Kind::Q5K,
        Kind::Q6K,
        Kind::Q8_0,
        Kind::Q5_0,
        Kind::Q5_1,
        Kind::Q4_0,
        Kind::Q4_1,
    ];

    pub fn of(ty: GgmlType) -> Option<Self> {
        Some(match ty {
            GgmlType::F32 => Self::F32,
            GgmlType::F16 => Self::F16,
            GgmlType::Q4_0 => Self::Q4_0,
            GgmlType::Q5_0 => Self::Q5_0,
            GgmlType::Q8_0 => Self::Q8_0,
            GgmlType::Q4_K => Self::Q4K,
            GgmlType::Q6_K => Self::Q6K,
            GgmlType::Q4_1 => Self::Q4_1,
            GgmlType::Q5_1 => Self::Q5_1,
            GgmlType::Q5_K => Self::Q5K,
            _ => return None,
        })
    }

    /// The kernel-name fragment (`mv_q4_k_1_0`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q4_0 => "q4_0",
            Self::Q5_0 => "q5_0",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
            Self::Q6K => "q6_k",
            Self::Q4_1 => "q4_1",
            Self::Q5_1 => "q5_1",
            Self::Q5K => "q5_k",
        }
    }

    /// The GGUF type of this kind.
    pub fn ggml(self) -> GgmlType {
        match self {
            Self::F32 => GgmlType::F32,
            Self::F16 => GgmlType::F16,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4K => GgmlType::Q4_K,
            Self::Q6K => GgmlType::Q6_K,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q5K => GgmlType::Q5_K,
        }
    }

    /// Whether the fused mat-vec must take its `_all` kernels for this kind (kernels/matvec.cu's
    /// mvx: the others leave its branch out, so Q4_K_M files keep their registers).
    pub fn fused_all_only(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1 | Self::Q5K)
    }

    /// Whether blocks are 256-weight K-quant super-blocks (a mat-vec unit of 64 weights).
    pub fn k_quant(self) -> bool {
        matches!(self, Self::Q4K | Self::Q5K | Self::Q6K)
    }

    /// Whether the mat-vec reads 8-bit activations (else f32).
    pub fn int8_activations(self) -> bool {
        !matches!(self, Self::F32 | Self::F16)
    }

    /// (bytes per block in the file, where its scale word sits, the word's bytes) of the types
    /// whose scale (Q4_1 / Q5_1: scale and min) moves to a plane.
    fn split(self) -> Option<(usize, usize, usize)> {
        match self {
            Self::Q4_0 => Some((18, 0, 2)),
            Self::Q5_0 => Some((22, 0, 2)),
            Self::Q8_0 => Some((34, 0, 2)),
            Self::Q6K => Some((210, 208, 2)),
            Self::Q4_1 => Some((20, 0, 4)),
            Self::Q5_1 => Some((24, 0, 4)),
            _ => None,
        }
    }
}

/// GGUF blocks -> device layout (see the module doc).
pub fn to_device_layout(kind: Kind, bytes: &[u8]) -> Vec<u8> {
    let Some((bb, at, sb)) = kind.split() else {
        return bytes.to_vec();
    };
    let n = bytes.len() / bb;
    let mut payload = Vec::with_capacity(bytes.len());
    let mut scales = Vec::with_capacity(sb * n);
    for b in bytes.chunks_exact(bb) {
        scales.extend_from_slice(&b[at..at + sb]);
        if at == 0 {
            payload.extend_from_slice(&b[sb..]);
        } else {
            payload.extend_from_slice(&b[..at]);
        }
    }
    payload.extend_from_slice(&scales);
    payload
}

/// A matrix `[rows, cols]` in device memory.
pub struct DevMatrix {
    pub kind: Kind,
    pub rows: usize,
    pub cols: usize,
    pub buf: DevBuf,
}

impl DevMatrix {
    pub fn upload(gpu: &Gpu, w: &Weight) -> Result<Self> {
        let kind = Self::kind(w)?;
        let host = to_device_layout(kind, w.bytes());
        Ok(Self {
            kind,
            rows: w.rows,
            cols: w.cols,
            buf: gpu.upload(&host)?,
        })
    }

    /// Matrices of one type and shape stacked into one (`n * rows`, cols): a mixture's experts,
    /// expert `e`'s row `r` at row `e * rows + r`.
    pub fn upload_stack(gpu: &Gpu, ws: &[Weight]) -> Result<Self> {
        let first = ws
            .first()
            .ok_or_else(|| CudaError::Other("an empty stack of matrices".into()))?;
        let kind = Self::kind(first)?;
        if let Some(w) = ws
            .iter()
            .find(|w| (w.ty, w.rows, w.cols) != (first.ty, first.rows, first.cols))
        {
            return Err(CudaError::Unsupported(format!(
                "{}: a {} [{}, {}] among {} [{}, {}] experts",
                w.name, w.ty, w.rows, w.cols, first.ty, first.rows, first.cols
            )));
        }
        let bytes: Vec<u8> = ws.iter().flat_map(|w| w.bytes().iter().copied()).collect();
        Ok(Self {
            kind,
            rows: ws.len() * first.rows,
            cols: first.cols,
            buf: gpu.upload(&to_device_layout(kind, &bytes))?,
        })
    }

    /// The rows of `w` that come in runs of `run` alternating between `parts` parts, part `part`
    /// of each (Qwen3.5's attn_q: per head `head_dim` query rows, then `head_dim` gate rows).
    /// Rows are whole blocks, so their bytes move as they are.
    pub fn upload_part(
        gpu: &Gpu,
        w: &Weight,
        run: usize,
        parts: usize,
        part: usize,
    ) -> Result<Self> {
        let kind = Self::kind(w)?;
        if run == 0 || part >= parts || !w.rows.is_multiple_of(run * parts) {
            return Err(CudaError::Other(format!(
                "{}: {} rows do not split into runs of {run} in {parts} parts",
                w.name, w.rows
            )));
        }
        let rb = w.row_bytes();
        let rows: Vec<u8> = w
            .bytes()
            .chunks_exact(rb * run)
            .skip(part)
            .step_by(parts)
            .flatten()
            .copied()
            .collect();
        Ok(Self {
            kind,
            rows: w.rows / parts,
            cols: w.cols,
            buf: gpu.upload(&to_device_layout(kind, &rows))?,
        })
    }

    fn kind(w: &Weight) -> Result<Kind> {
        Kind::of(w.ty).ok_or_else(|| {
            CudaError::Unsupported(format!(
                "{} of type {} (the GPU kernels read F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                w.name, w.ty
            ))
        })
    }

    /// Device bytes (the same as the file's).
    pub fn bytes(&self) -> usize {
        self.buf.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_scales_move_to_a_plane() {
        // two blocks: scale bytes (1,2) and (3,4), payloads of 32 bytes each
        let mut file = vec![1u8, 2];
        file.extend(0..32u8);
        file.extend([3u8, 4]);
        file.extend(100..132u8);
        let dev = to_device_layout(Kind::Q8_0, &file);
        assert_eq!(dev.len(), file.len());
        assert_eq!(&dev[..32], &(0..32u8).collect::<Vec<_>>()[..]);
        assert_eq!(&dev[32..64], &(100..132u8).collect::<Vec<_>>()[..]);
        assert_eq!(&dev[64..], &[1, 2, 3, 4]);
    }

    #[test]
    fn q5_1_scale_and_min_move_as_one_word() {
        // two blocks: (d, m) bytes (1,2,3,4) and (5,6,7,8), payloads of 20 bytes each
        let mut file = vec![1u8, 2, 3, 4];
        file.extend(0..20u8);
        file.extend([5u8, 6, 7, 8]);
        file.extend(100..120u8);
        let dev = to_device_layout(Kind::Q5_1, &file);
        assert_eq!(dev.len(), file.len());
        assert_eq!(&dev[..20], &(0..20u8).collect::<Vec<_>>()[..]);
        assert_eq!(&dev[20..40], &(100..120u8).collect::<Vec<_>>()[..]);
        assert_eq!(&dev[40..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn every_kind_names_its_ggml_type() {
        for k in Kind::QUANTIZED.into_iter().chain([Kind::F32, Kind::F16]) {
            assert_eq!(Kind::of(k.ggml()), Some(k));
        }
    }

    #[test]
    fn q6_k_keeps_its_payload_order() {
        let mut file: Vec<u8> = (0..210).map(|i| i as u8).collect();
        file.extend((0..210).map(|i| (i as u8).wrapping_add(7)));
        let dev = to_device_layout(Kind::Q6K, &file);
        assert_eq!(&dev[..208], &file[..208]);
        assert_eq!(&dev[208..416], &file[210..418]);
        assert_eq!(&dev[416..], &[file[208], file[209], file[418], file[419]]);
    }
}
