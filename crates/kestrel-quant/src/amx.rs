//! Intel AMX (Advanced Matrix Extensions): eight 1 KiB tile registers and a unit that
//! multiplies int8 tiles into i32 tiles (`tdpb*d`: a 16 x 64 by 64 x 16 byte product per
//! instruction). Prefill's repacked Q4_K and Q6_K matmuls use it for their integer sums when
//! it is here.
//!
//! Three things must hold before a tile instruction may run, or the process dies of SIGILL:
//! the CPU reports AMX-TILE and AMX-INT8 (CPUID leaf 7), the OS saves tile state (XCR0 bits
//! 17 and 18), and Linux has granted this process the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM)`,
//! Linux 5.16+). [`available`] checks all three once. `KESTREL_AMX=0` turns AMX off (A/B
//! measurements; the VNNI kernels then run, with the same results).
//!
//! Stable Rust has no AMX intrinsics, so the instructions are written as inline assembly; the
//! compiler never touches tile registers itself, so none are clobbered behind its back.

/// Tokens from which a matmul's integer sums go through AMX tiles, where the CPU has them;
/// results are the same either way. Below it the per-group B-tile build does not pay: one
/// 1.5B layer's Q4_K matmuls took 7.0 ms with AMX against 6.7 with VNNI at 16 tokens, 9.5
/// against 11.7 at 32 (`examples/prefill_matmul`, Xeon, 2 threads).
pub const AMX_MIN_TOKENS: usize = 32;

/// Why AMX does or does not run in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmxState {
    /// Detected and granted: the tile kernels run.
    On,
    /// The CPU and OS have it, and `KESTREL_AMX=0` (or `off`) turned it off.
    TurnedOff,
    /// The CPU reports no AMX-TILE / AMX-INT8 (or no AVX-512 VNNI, which the kernels use too).
    NotInCpu,
    /// The CPU has AMX but the OS does not save tile state (XCR0 bits 17 and 18).
    NotEnabledByOs,
    /// Linux refused the tile data (`arch_prctl` error number: EINVAL before Linux 5.16,
    /// ENOSPC when a signal stack is too small for the tile state).
    Refused(i64),
}

impl std::fmt::Display for AmxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::On => write!(f, "on"),
            Self::TurnedOff => write!(f, "turned off by KESTREL_AMX"),
            Self::NotInCpu => write!(f, "not in this CPU"),
            Self::NotEnabledByOs => write!(f, "in the CPU, but the OS does not enable tile state"),
            Self::Refused(errno) => {
                write!(
                    f,
                    "in the CPU, but Linux refused the tile data (arch_prctl errno {errno})"
                )
            }
        }
    }
}

/// Whether the AMX int8 kernels may run in this process (detected and requested once).
pub fn available() -> bool {
    state() == AmxState::On
}

/// This process's AMX state, decided once (the first call asks Linux for the tile data).
pub fn state() -> AmxState {
    static STATE: std::sync::OnceLock<AmxState> = std::sync::OnceLock::new();
    *STATE.get_or_init(|| {
        let turned_off = std::env::var("KESTREL_AMX").is_ok_and(|v| v == "0" || v == "off");
        detect_and_request(turned_off)
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect_and_request(turned_off: bool) -> AmxState {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 {
        return AmxState::NotInCpu;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    if !tile || !int8 || !crate::cpu::avx512_available() {
        return AmxState::NotInCpu;
    }
    // XCR0 via XGETBV, valid once CPUID.1:ECX.OSXSAVE (bit 27) says the OS enabled it.
    let osxsave = __cpuid(1).ecx >> 27 & 1 == 1;
    if !osxsave || xgetbv0() >> 17 & 3 != 3 {
        return AmxState::NotEnabledByOs;
    }
    if turned_off {
        return AmxState::TurnedOff;
    }
    match request_tile_data() {
        0 => AmxState::On,
        ret => AmxState::Refused(-ret),
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect_and_request(_turned_off: bool) -> AmxState {
    AmxState::NotInCpu
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller checked CPUID.1:ECX.OSXSAVE, so XGETBV with ECX = 0 is defined.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
            options(nomem, nostack, preserves_flags));
    }
    (hi as u64) << 32 | lo as u64
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: asks Linux for the tile data state
/// (process-wide): 0, or minus the error number. Older kernels answer EINVAL, and then AMX
/// stays off.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> i64 {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a plain syscall with integer arguments; it writes no user memory.
    unsafe {
        std::arch::asm!("syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _, lateout("r11") _,
            options(nostack));
    }
    ret
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
/// A tile configuration (palette 1): rows and bytes per row of each of the eight tiles.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    /// `shapes[i] = (rows, bytes per row)` of tile `i` (at most 16 x 64).
    pub(crate) fn new(shapes: &[(u8, u16)]) -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        for (i, &(rows, colsb)) in shapes.iter().enumerate().take(8) {
            debug_assert!(rows <= 16 && colsb <= 64);
            c[16 + 2 * i..18 + 2 * i].copy_from_slice(&colsb.to_le_bytes());
            c[48 + i] = rows;
        }
        Self(c)
    }

    /// Loads the configuration into this thread's tile unit (zeroing every tile).
    ///
    /// # Safety
    /// [`available`] returned true.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn load(&self) {
        std::arch::asm!("ldtilecfg [{0}]", in(reg) self.0.as_ptr(), options(nostack, readonly));
    }
}

/// Returns this thread's tiles to the init state, so context switches stop saving 8 KiB of
/// tile data.
///
/// # Safety
/// [`available`] returned true.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn release() {
    std::arch::asm!("tilerelease", options(nostack, nomem));
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::AmxState;

    #[test]
    fn the_kernels_line_says_why_amx_is_off_where_the_cpu_has_it() {
        let line = crate::kernels_summary();
        match super::state() {
            AmxState::On => assert!(super::available() && line.contains("AMX int8"), "{line}"),
            AmxState::NotInCpu => assert!(!super::available() && !line.contains("AMX"), "{line}"),
            other => {
                assert!(!super::available());
                assert!(line.ends_with(&format!("AMX {other}")), "{line}");
            }
        }
        assert_eq!(
            AmxState::Refused(28).to_string(),
            "in the CPU, but Linux refused the tile data (arch_prctl errno 28)"
        );
    }

    #[test]
    fn a_signed_by_unsigned_tile_product_is_the_integer_product() {
        if !super::available() {
            eprintln!("AMX not available here: skipped");
            return;
        }
        // C[16 x 16] i32 = A[16 x 64] i8 . B[64 x 16] u8, B in the 4-byte interleaved layout.
        let a: Vec<i8> = (0..1024).map(|i| ((i * 7) % 255) as i8).collect();
        let b: Vec<u8> = (0..1024).map(|i| ((i * 5) % 256) as u8).collect();
        let mut c = vec![0i32; 256];
        let cfg = super::TileConfig::new(&[(16, 64), (16, 64), (16, 64)]);
        // SAFETY: AMX is available; every tile is 16 rows of 64 bytes, as the buffers are.
        unsafe {
            cfg.load();
            std::arch::asm!(
                "tilezero tmm0",
                "tileloadd tmm1, [{a} + {s} * 1]",
                "tileloadd tmm2, [{b} + {s} * 1]",
                "tdpbsud tmm0, tmm1, tmm2",
                "tilestored [{c} + {s} * 1], tmm0",
                a = in(reg) a.as_ptr(), b = in(reg) b.as_ptr(), c = in(reg) c.as_mut_ptr(),
                s = in(reg) 64usize, options(nostack));
            super::release();
        }
        for m in 0..16 {
            for n in 0..16 {
                let want: i32 = (0..64)
                    .map(|k| a[m * 64 + k] as i32 * b[(k / 4) * 64 + n * 4 + k % 4] as i32)
                    .sum();
                assert_eq!(c[m * 16 + n], want, "C[{m}][{n}]");
            }
        }
    }
}
