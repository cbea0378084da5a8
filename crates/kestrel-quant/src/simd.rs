//! x86-64 vector helpers shared by the dot kernels and the repacked layouts' kernels.

use std::arch::x86_64::__m512i;

/// `vpdpwssd` as written: LLVM otherwise splits the intrinsic into `vpmaddwd + vpaddd` (its
/// tuning for cores where the fused form is slow), one extra vector op per use.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut r = acc;
    std::arch::asm!(
        "vpdpwssd {r}, {a}, {b}",
        r = inout(zmm_reg) r,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}
