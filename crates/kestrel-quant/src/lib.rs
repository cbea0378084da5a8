//! Quantized weights for kestrel: ggml block layouts, reference (de)quantization, and the dot
//! kernels behind every matmul.
//!
//! Shaped like the data's path through a matmul:
//! - [`blocks`]: `#[repr(C)]` structs byte-for-byte as ggml's (size-asserted at compile time).
//! - [`dequantize_row`]: blocks -> f32, bit-exact with llama.cpp's `dequantize_row_*`.
//! - [`quantize_row`]: f32 -> blocks. The activation quantizers (Q8_0, Q8_1, Q8_K) are
//!   llama.cpp's `_ref` versions exactly, so activations entering a matmul carry the same bytes
//!   as llama.cpp's; the weight quantizers (Q4_0, Q8_0, Q4_K, Q6_K, ...) are its `_ref` ones.
//! - [`dot`]: `vec_dot(weight row, activation row)`, with a scalar oracle for every pair and
//!   AVX2 / AVX-512 VNNI kernels chosen once at run time; [`vec_dot_multi`] runs one weight row
//!   against several activation rows, decoding each weight block once (batched prefill).
//! - [`repack`]: weights regrouped at load for the AVX-512 kernels (Q4_K for the AVX2 ones too);
//!   prefill's K-quant matmuls take their integer sums from [`amx`] tiles where the CPU and OS
//!   allow it.
//! - [`cpu`]: what this CPU runs (the dot backend, the vendor, AVX-512), asked by the others;
//!   [`kernels_summary`] puts the choices of all of them into one line.
//!
//! All lengths are checked up front and reported as [`QuantError`]; rows are read with
//! unaligned loads, so any `&[u8]` from a mapped GGUF works.

pub mod amx;
pub mod blocks;
pub mod cpu;
mod dequant;
pub mod dot;
mod error;
pub mod float16;
mod quantize;
pub mod repack;
#[cfg(target_arch = "x86_64")]
mod simd;

pub use blocks::row_bytes;
pub use dequant::dequantize_row;
pub use dot::{
    has_vec_dot, matmul_few, matvec, try_vec_dot, vec_dot, vec_dot_multi, vec_dot_multi_with,
    vec_dot_rows, vec_dot_rows_each, vec_dot_rows_each_with, vec_dot_rows_with, vec_dot_type,
    Backend,
};
pub use error::QuantError;
pub use kestrel_gguf::GgmlType;
pub use quantize::{quantize_activation_row, quantize_row};

pub use cpu::{avx512_available, cpu_is_amd};

/// The CPU kernels this process runs, in words (for `kestrel bench` and logs): the dot
/// backend, and AMX where the prefill matmuls use it.
pub fn kernels_summary() -> String {
    let ahead = crate::cpu::weight_prefetch_ahead();
    let prefetch = if ahead == 0 {
        "no weight prefetch".to_string()
    } else {
        format!("decode prefetches weights {ahead} B ahead")
    };
    let base = match cpu::Backend::detect() {
        cpu::Backend::Generic => "portable (scalar)".to_string(),
        cpu::Backend::Avx2 => {
            format!("AVX2 (Q4_K, Q5_K, Q6_K repacked; Q8_0, Q5_x, Q4_x row-tiled; {prefetch})")
        }
        cpu::Backend::Avx512Vnni => {
            format!("AVX-512 VNNI (Q4_K, Q5_K, Q6_K, Q8_0, Q5_x, Q4_x repacked; {prefetch})")
        }
    };
    match crate::amx::state() {
        crate::amx::AmxState::On => format!(
            "{base}; AMX int8 for Q4_K and Q6_K matmuls of {}+ tokens",
            crate::amx::AMX_MIN_TOKENS
        ),
        crate::amx::AmxState::NotInCpu => base,
        other => format!("{base}; AMX {other}"),
    }
}
