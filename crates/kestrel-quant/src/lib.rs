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
//! - [`repack`]: weights regrouped at load for the AVX-512 kernels; prefill's K-quant matmuls
//!   take their integer sums from [`amx`] tiles where the CPU and OS allow it.
//!
//! All lengths are checked up front and reported as [`QuantError`]; rows are read with
//! unaligned loads, so any `&[u8]` from a mapped GGUF works.

pub mod amx;
pub mod blocks;
mod dequant;
pub mod dot;
mod error;
pub mod float16;
mod quantize;
pub mod repack;

pub use blocks::row_bytes;
pub use dequant::dequantize_row;
pub use dot::{
    has_vec_dot, kernels_summary, matmul_few, matvec, try_vec_dot, vec_dot, vec_dot_multi,
    vec_dot_multi_with, vec_dot_rows, vec_dot_rows_each, vec_dot_rows_each_with, vec_dot_rows_with,
    vec_dot_type, Backend,
};
pub use error::QuantError;
pub use kestrel_gguf::GgmlType;
pub use quantize::{quantize_activation_row, quantize_row};

/// Whether CPUID names AMD as the vendor: some prefetch settings are tuned per vendor, as
/// measured (the weight stream's in [`repack::weight_prefetch_ahead`], the K/V cache's in
/// decode attention).
pub fn cpu_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0 exists on every x86-64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[0..4].copy_from_slice(&r.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&r.edx.to_le_bytes());
        vendor[8..12].copy_from_slice(&r.ecx.to_le_bytes());
        &vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
