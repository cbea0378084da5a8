//! The kernels: CUDA C++ in `kernels/`, compiled by NVRTC at start for the device's own
//! architecture (sm_90 on an H200) and cached on disk.
//!
//! Why NVRTC at start rather than PTX shipped in the binary:
//! - One binary for everyone, built with no CUDA toolkit (CI and most users have none): an
//!   nvcc step in build.rs would make the toolkit a build dependency of the whole workspace.
//! - Machine code for the exact device: NVRTC compiles straight to the device's SASS
//!   (`--gpu-architecture=sm_XY`), so Hopper (and later chips) get their own code paths, where
//!   PTX for one fixed virtual architecture would leave the driver to JIT it at every load
//!   (~110 ms more per load on the H200, shared/examples/cuda-smoke) and tie every kernel to
//!   the oldest architecture we chose to ship.
//! - The cost is one compile on a device's first start; the cubin is then cached under
//!   `$XDG_CACHE_HOME/kestrel/cuda` (or `~/.cache/kestrel/cuda`), keyed by a hash of the source,
//!   the architecture and the NVRTC version, so later starts load it in milliseconds.

use crate::error::{CudaError, Result};
use cudarc::nvrtc::sys as nv;
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The kernel files, in the order they form one translation unit.
const FILES: [(&str, &str); 10] = [
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("matvec.cu", include_str!("kernels/matvec.cu")),
    ("qkv.cu", include_str!("kernels/qkv.cu")),
    ("mmq.cu", include_str!("kernels/mmq.cu")),
    ("mmh.cu", include_str!("kernels/mmh.cu")),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("flash.cu", include_str!("kernels/flash.cu")),
    ("deltanet.cu", include_str!("kernels/deltanet.cu")),
    ("moe.cu", include_str!("kernels/moe.cu")),
];

/// Where `KESTREL_CUDA_KERNELS` points: a directory holding the same files, compiled instead of
/// the ones built into the binary. Kernel work is timed by A/B in one call on the GPU host: the
/// kernels of another revision (scripts/gpu/bundle.sh's `BASE_KERNELS=REV`) against these, with
/// the same host code. The kernels' names and arguments must be the binary's own.
pub const KERNELS_ENV: &str = "KESTREL_CUDA_KERNELS";

/// Every kernel, as one translation unit: the binary's own, or those in `KESTREL_CUDA_KERNELS`
/// (unset or empty: the binary's).
pub fn source() -> Result<String> {
    let dir = std::env::var_os(KERNELS_ENV).filter(|d| !d.is_empty());
    source_from(dir.map(PathBuf::from).as_deref())
}

fn source_from(dir: Option<&Path>) -> Result<String> {
    // the stamps of crate::timeline, when asked for: another source, so another cached cubin
    let mut src = String::from(if crate::timeline::requested().is_some() {
        "#define KESTREL_TIMELINE 1\n"
    } else {
        ""
    });
    let Some(dir) = dir else {
        src += &FILES.map(|(_, text)| text).join("\n");
        return Ok(src);
    };
    let mut parts = Vec::with_capacity(FILES.len());
    for (name, _) in FILES {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            CudaError::Other(format!(
                "{KERNELS_ENV}: cannot read {}: {e}",
                path.display()
            ))
        })?;
        parts.push(text);
    }
    src += &parts.join("\n");
    Ok(src)
}

/// FNV-1a: a hash that stays the same across Rust versions (the cache key outlives a build).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("kestrel").join("cuda"))
}

fn nvrtc_version() -> (i32, i32) {
    let (mut maj, mut min) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { nv::nvrtcVersion(&mut maj, &mut min) };
    (maj, min)
}

/// Where `KESTREL_CUDA_CUBINS` points: a directory of kernels compiled ahead of time on
/// another machine (`kestrel gpu-check --compile-only ARCH --out DIR`; scripts/gpu/bundle.sh
/// ships them to the GPU host, where a fresh machine would otherwise spend ~3 minutes in
/// NVRTC). Each file is named by its architecture and a hash of its source, so only the
/// kernels of this very source are taken from it.
pub const CUBINS_ENV: &str = "KESTREL_CUDA_CUBINS";

/// The name of the cubin of `src` for `arch` in a `KESTREL_CUDA_CUBINS` directory.
fn shipped_name(src: &str, arch: &str) -> String {
    format!(
        "kernels-{arch}-{:016x}.cubin",
        fnv1a(format!("{src}\n{arch}").as_bytes())
    )
}

/// The kernels (as [`source`] reads them) compiled for `arch` into `dir`, under the name a start
/// with `KESTREL_CUDA_CUBINS=dir` looks for; returns the file and its size.
pub fn write_shipped(arch: &str, dir: &std::path::Path) -> Result<(PathBuf, usize)> {
    let src = source()?;
    let bin = compile(&src, arch)?;
    let path = dir.join(shipped_name(&src, arch));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, &bin))
        .map_err(|e| CudaError::Other(format!("writing {}: {e}", path.display())))?;
    Ok((path, bin.len()))
}

/// The cubin for `arch` ("sm_90"): compiled ahead of time (`KESTREL_CUDA_CUBINS`), from the
/// disk cache, or compiled (and cached). Returns the cubin and whether it was compiled
/// elsewhere or earlier (not by this start). `fresh`: skip the shipped ones (the driver
/// refused one).
pub fn cubin(arch: &str, fresh: bool) -> Result<(Vec<u8>, bool)> {
    let src = source()?;
    let shipped = std::env::var_os(CUBINS_ENV)
        .filter(|d| !d.is_empty() && !fresh)
        .map(|d| PathBuf::from(d).join(shipped_name(&src, arch)));
    if let Some(bin) = shipped.and_then(|p| std::fs::read(p).ok()) {
        if !bin.is_empty() {
            return Ok((bin, true));
        }
    }
    let (maj, min) = nvrtc_version();
    let key = fnv1a(format!("{src}\n{arch}\n{maj}.{min}").as_bytes());
    let path = cache_dir().map(|d| d.join(format!("kernels-{arch}-{key:016x}.cubin")));
    if let Some(p) = &path {
        if let Ok(bin) = std::fs::read(p) {
            if !bin.is_empty() {
                return Ok((bin, true));
            }
        }
    }
    let bin = compile(&src, arch)?;
    if let Some(p) = &path {
        // A cache that cannot be written only costs the next start a compile.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // A file of this process's own: two processes compiling the same source at once (h200.sh
        // warms several kernel sets side by side) must not rename each other's half-written file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bin).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok((bin, false))
}

fn check(r: nv::nvrtcResult, arch: &str, what: &str) -> Result<()> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Compile {
            arch: arch.into(),
            log: format!("{what}: {r:?}"),
        })
    }
}

/// NVRTC straight to machine code (cudarc's helper stops at PTX).
pub fn compile(src: &str, arch: &str) -> Result<Vec<u8>> {
    let bad = |e: std::ffi::NulError| CudaError::Compile {
        arch: arch.into(),
        log: e.to_string(),
    };
    let csrc = CString::new(src).map_err(bad)?;
    let name = CString::new("kestrel.cu").map_err(bad)?;
    let opts: Vec<CString> = [
        format!("--gpu-architecture={arch}"),
        "-std=c++17".into(),
        "--use_fast_math".into(),
        "-default-device".into(),
    ]
    .into_iter()
    .map(CString::new)
    .collect::<std::result::Result<_, _>>()
    .map_err(bad)?;
    let optp: Vec<*const std::ffi::c_char> = opts.iter().map(|s| s.as_ptr()).collect();
    // SAFETY: NVRTC's C API with valid NUL-terminated strings; the program is destroyed on
    // every path after creation.
    unsafe {
        let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
        check(
            nv::nvrtcCreateProgram(
                &mut prog,
                csrc.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
            arch,
            "create",
        )?;
        let r = nv::nvrtcCompileProgram(prog, optp.len() as i32, optp.as_ptr());
        let out = if r != nv::nvrtcResult::NVRTC_SUCCESS {
            let mut n = 0usize;
            nv::nvrtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0u8; n];
            nv::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut _);
            Err(CudaError::Compile {
                arch: arch.into(),
                log: String::from_utf8_lossy(&log)
                    .trim_end_matches('\0')
                    .to_string(),
            })
        } else {
            let mut n = 0usize;
            check(nv::nvrtcGetCUBINSize(prog, &mut n), arch, "cubin size").and_then(|_| {
                let mut bin = vec![0u8; n];
                check(
                    nv::nvrtcGetCUBIN(prog, bin.as_mut_ptr() as *mut _),
                    arch,
                    "cubin",
                )?;
                Ok(bin)
            })
        };
        nv::nvrtcDestroyProgram(&mut prog);
        out
    }
}

#[cfg(test)]
mod tests {
    /// Every kernel compiles for Hopper wherever NVRTC loads: no GPU needed (CI installs
    /// NVRTC from PyPI, `.ci/run`), so a kernel that does not build fails here, not on the
    /// GPU host.
    #[test]
    fn kernels_compile_for_sm_90() {
        if let Err(e) = crate::probe::nvrtc() {
            eprintln!("skipped: NVRTC is not on the library path ({e})");
            return;
        }
        let src = super::source().unwrap_or_else(|e| panic!("{e}"));
        let bin = super::compile(&src, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        assert!(bin.len() > 1000, "a cubin of {} bytes", bin.len());
    }

    /// A directory of kernel sources is read file by file in the binary's order (the kernels/
    /// directory itself gives the built-in source back); a missing file is named.
    #[test]
    fn kernel_sources_from_a_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
        let read = super::source_from(Some(&dir)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            read,
            super::source_from(None).unwrap_or_else(|e| panic!("{e}"))
        );
        let empty = std::env::temp_dir().join(format!("kestrel-no-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap_or_else(|e| panic!("{e}"));
        let err = super::source_from(Some(&empty))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("KESTREL_CUDA_KERNELS") && err.contains("common.cuh"),
            "{err}"
        );
        let _ = std::fs::remove_dir(&empty);
    }
}
