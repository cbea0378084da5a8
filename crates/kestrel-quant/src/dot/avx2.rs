//! AVX2 + FMA + F16C kernels (`_mm256_maddubs_epi16` for the u8 x i8 products).
use super::x86::dot_u8i8_avx2;
super::x86::x86_kernels!("avx2,fma,f16c", dot_u8i8_avx2);
