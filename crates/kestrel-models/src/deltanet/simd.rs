//! Run-time choice of vector width for the delta rule's kernels.

/// Defines `$name` as `$imp` compiled for AVX-512, AVX2 and the baseline, picked at run time
/// (`$imp` is `#[inline(always)]`, so each variant gets its own vector code).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident => $imp:ident ($($arg:ident : $ty:ty),* $(,)?)) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn v512($($arg: $ty),*) {
                    $imp($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v256($($arg: $ty),*) {
                    $imp($($arg),*)
                }
                if crate::vexp::has_avx512() {
                    // SAFETY: the CPU has AVX-512F and FMA (checked).
                    return unsafe { v512($($arg),*) };
                }
                if crate::vexp::has_avx2() {
                    // SAFETY: the CPU has AVX2 and FMA (checked).
                    return unsafe { v256($($arg),*) };
                }
            }
            $imp($($arg),*)
        }
    };
}
