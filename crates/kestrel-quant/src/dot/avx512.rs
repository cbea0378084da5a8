//! AVX-512 VNNI kernels: the AVX2 kernels with `vpdpbusd` (u8 x i8, four products summed into
//! each i32 lane, no i16 saturation step) on 256-bit vectors via AVX512VL, which also doubles
//! the vector registers to 32 so the multi-row kernels keep their accumulators in registers.

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_u8i8_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
}

super::x86::x86_kernels!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dot_u8i8_vnni
);
