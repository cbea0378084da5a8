//! What this CPU runs: the dot backend detected once, the vendor (some prefetch settings are
//! tuned per vendor), and whether the AVX-512 or AVX2 kernels (and so which repacked layouts) apply. Every
//! other module asks here; this one asks nothing of them.

use std::sync::OnceLock;

/// A kernel family. Ordered from slowest to fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Backend {
    /// Scalar reference, any CPU.
    Generic,
    /// x86 AVX2 + FMA + F16C.
    Avx2,
    /// x86 AVX-512 F/BW/VL + VNNI (plus the AVX2 set).
    Avx512Vnni,
}

impl Backend {
    /// The fastest backend this CPU runs within [`isa_cap`], detected once.
    pub fn detect() -> Backend {
        static BEST: OnceLock<Backend> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = Backend::available()
                .into_iter()
                .max()
                .unwrap_or(Backend::Generic);
            best.min(isa_cap())
        })
    }

    /// Every backend this CPU can run (always includes `Generic`).
    pub fn available() -> Vec<Backend> {
        let mut out = vec![Backend::Generic];
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2 {
                out.push(Backend::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    out.push(Backend::Avx512Vnni);
                }
            }
        }
        out
    }

    pub(crate) fn is_available(self) -> bool {
        static AVAIL: OnceLock<Vec<Backend>> = OnceLock::new();
        AVAIL.get_or_init(Backend::available).contains(&self)
    }
}

/// The widest kernel family this process may use, for every SIMD choice (quantized dots,
/// attention, exp): `KESTREL_QUANT_BACKEND=generic|avx2` caps it, so one machine runs and
/// measures the narrower paths; unset, nothing is capped. It never enables an unsupported one.
pub fn isa_cap() -> Backend {
    static CAP: OnceLock<Backend> = OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("KESTREL_QUANT_BACKEND").as_deref() {
        Ok("generic") => Backend::Generic,
        Ok("avx2") => Backend::Avx2,
        _ => Backend::Avx512Vnni,
    })
}

/// Whether CPUID names AMD as the vendor: some prefetch settings are tuned per vendor, as
/// measured (the weight stream's in [`weight_prefetch_ahead`], the K/V cache's in
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

/// Whether the detected backend is AVX2 or wider (the repacked Q4_K, Q5_K and Q6_K kernels run
/// there).
pub fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Backend::detect() >= Backend::Avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the detected backend is AVX-512 VNNI: every repacked layout's kernels run there
/// (repacking pays only where they do).
pub fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Backend::detect() == Backend::Avx512Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// How many bytes ahead of its reads a decode kernel (one to four tokens) prefetches the weight
/// stream into L2, every line: `KESTREL_WEIGHT_PREFETCH=BYTES` (0 turns it off). The hardware
/// prefetchers stop at 4 KiB pages and keep too few lines in flight for one core to reach the
/// memory's bandwidth on Intel server cores. Measured (BENCHMARKS.md, eleventh session): on the
/// Xeon, 4 KiB ahead took the 1.5B's decode from 13.3–13.5 to 21.1–21.2 tok/s (8 KiB: 20.9); on
/// the AMD EPYC VM it made decode slower (ninth session), so AMD CPUs default to 0 and others
/// to 4096.
pub fn weight_prefetch_ahead() -> usize {
    static AHEAD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        let default = if cpu_is_amd() { 0 } else { 4096 };
        std::env::var("KESTREL_WEIGHT_PREFETCH")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    })
}

/// Prefetches `len` bytes from `ahead` bytes past `p` into L2, a line at a time (nothing when
/// `ahead` is 0). Addresses past the matrix are fine: a prefetch never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, ahead: usize, len: usize) {
    if ahead == 0 {
        return;
    }
    let mut at = 0;
    while at < len {
        let q = p.wrapping_add(ahead + at);
        // SAFETY: a prefetch is a hint and never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(q as *const i8)
        };
        at += 64;
    }
}
