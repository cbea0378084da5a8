//! `KESTREL_CUDA_TIMELINE=FILE`: where a replayed decode step's time goes, kernel by kernel.
//!
//! ncu times kernels one at a time (no programmatic overlap between them) and nsys is not on
//! every GPU host, so neither shows the gaps between a graph's kernels as it runs. With this
//! variable set, the kernels are built with `KESTREL_TIMELINE` (kernels/common.cuh): every
//! launch stamps the GPU's global timer when its first block reaches the wait on the previous
//! kernel, when its first and last blocks get past it, and when its last warp ends. The
//! [`REPLAY`]th replay of the first decode graph is recorded: one CSV line a launch goes to
//! FILE and a summary by kernel to stderr. The stamps' atomics cost a little themselves:
//! compare the step's total with the same run unstamped.

use crate::device::{DevBuf, Gpu};
use crate::error::Result;
use crate::graph::StepGraph;
use std::fmt::Write as _;
use std::path::PathBuf;

pub const ENV: &str = "KESTREL_CUDA_TIMELINE";

/// common.cuh's TL_SLOTS, TL_SUBS, TL_FIELDS: slots by grid id, copies by block, u64 fields.
const SLOTS: usize = 4096;
const SUBS: usize = 32;
const FIELDS: usize = 8;
/// The replay recorded (the ones before it warm caches and clocks).
const REPLAY: usize = 8;

/// The file the timeline goes to, when asked for (the variable set and not empty).
pub fn requested() -> Option<PathBuf> {
    std::env::var_os(ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The stamps' buffer, and how far the model is from the replay to record.
pub(crate) struct Timeline {
    buf: DevBuf,
    path: PathBuf,
    replays: usize,
    done: bool,
}

impl Timeline {
    /// Allocates the stamps' buffer (8 MiB, outside the memory plan: a diagnostic) and points
    /// the kernels' `kst_timeline` at it.
    pub fn new(gpu: &Gpu, path: PathBuf) -> Result<Self> {
        let buf = gpu.alloc(SLOTS * SUBS * FIELDS * 8)?;
        gpu.set_global_ptr("kst_timeline", buf.ptr)?;
        Ok(Timeline {
            buf,
            path,
            replays: 0,
            done: false,
        })
    }

    /// Counts a graph replay; whether this is the one to record.
    pub fn due(&mut self) -> bool {
        if self.done {
            return false;
        }
        self.replays += 1;
        self.replays == REPLAY
    }

    /// Replays `graph` with the stamps cleared, then writes the CSV and prints the summary.
    pub fn record(&mut self, gpu: &Gpu, graph: &StepGraph) -> Result<()> {
        self.done = true;
        // SAFETY: the buffer is ours and `bytes` long.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.buf.ptr,
                0,
                self.buf.bytes,
                gpu.stream.cu_stream(),
            )?;
        }
        graph.launch(gpu)?;
        let mut raw = vec![0u64; SLOTS * SUBS * FIELDS];
        gpu.read(self.buf.ptr, &mut raw)?;
        let names: Vec<String> = graph
            .kernel_order()?
            .into_iter()
            .map(|f| gpu.kernel_name(f).unwrap_or("?").to_string())
            .collect();
        let launches = launches(&raw);
        // a diagnostic: a file that cannot be written is said, and the decode goes on
        if let Err(e) = std::fs::write(&self.path, csv(&launches, &names)) {
            eprintln!("{ENV}: writing {}: {e}", self.path.display());
        }
        eprint!("{}", summary(&launches, &names, &self.path));
        Ok(())
    }
}

/// One launch's stamps, nanoseconds of the global timer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Launch {
    grid: u64,
    /// The first and the last block at the wait on the previous kernel.
    arrived: u64,
    arrived_last: u64,
    /// The first and the last block past it.
    first: u64,
    last: u64,
    /// The last warp's end.
    end: u64,
    blocks: u64,
}

/// The launches stamped in `raw` (common.cuh's layout), in launch order.
fn launches(raw: &[u64]) -> Vec<Launch> {
    let mut out: Vec<Launch> = raw
        .chunks_exact(SUBS * FIELDS)
        .filter_map(|slot| {
            let mut l: Option<Launch> = None;
            for c in slot.chunks_exact(FIELDS).filter(|c| c[0] != 0) {
                let one = Launch {
                    grid: c[0] - 1,
                    arrived: !c[1],
                    arrived_last: c[6],
                    first: !c[2],
                    last: c[3],
                    end: c[4],
                    blocks: c[5],
                };
                l = Some(match l {
                    None => one,
                    Some(a) => Launch {
                        grid: a.grid,
                        arrived: a.arrived.min(one.arrived),
                        arrived_last: a.arrived_last.max(one.arrived_last),
                        first: a.first.min(one.first),
                        last: a.last.max(one.last),
                        end: a.end.max(one.end),
                        blocks: a.blocks + one.blocks,
                    },
                });
            }
            l
        })
        .collect();
    out.sort_by_key(|l| l.grid);
    out
}

fn csv(launches: &[Launch], names: &[String]) -> String {
    let t0 = launches.first().map_or(0, |l| l.first);
    let rel = |t: u64| t as i64 - t0 as i64;
    let mut s = String::from(
        "index,kernel,blocks,arrived_ns,arrived_last_ns,first_ns,last_ns,end_ns,run_ns,gap_before_ns\n",
    );
    let mut prev_end = None;
    for (i, l) in launches.iter().enumerate() {
        let gap = prev_end.map_or(0, |e: u64| l.first as i64 - e as i64);
        let _ = writeln!(
            s,
            "{i},{},{},{},{},{},{},{},{},{gap}",
            names.get(i).map_or("?", |n| n.as_str()),
            l.blocks,
            rel(l.arrived),
            rel(l.arrived_last),
            rel(l.first),
            rel(l.last),
            rel(l.end),
            l.end as i64 - l.first as i64,
        );
        prev_end = Some(l.end);
    }
    s
}

/// Per kernel name (in first-launch order): launches, and the sums of run, gap before, tail
/// (the last block's start to the end) and blocks, ns.
#[derive(Default)]
struct ByKernel {
    n: usize,
    run: i64,
    gap: i64,
    tail: i64,
    blocks: u64,
}

fn summary(launches: &[Launch], names: &[String], path: &std::path::Path) -> String {
    let mut s = String::new();
    let (Some(first), Some(last)) = (launches.first(), launches.last()) else {
        return format!("timeline: no launch was stamped ({})\n", path.display());
    };
    if launches.len() != names.len() {
        let _ = writeln!(
            s,
            "timeline: {} launches stamped, the graph has {} kernels: the names below may be off",
            launches.len(),
            names.len()
        );
    }
    let mut order: Vec<&str> = Vec::new();
    let mut by: std::collections::HashMap<&str, ByKernel> = Default::default();
    let (mut run, mut gap) = (0i64, 0i64);
    for (i, l) in launches.iter().enumerate() {
        let name = names.get(i).map_or("?", |n| n.as_str());
        let g = if i == 0 {
            0
        } else {
            l.first as i64 - launches[i - 1].end as i64
        };
        let r = l.end as i64 - l.first as i64;
        run += r;
        gap += g;
        let k = by.entry(name).or_insert_with(|| {
            order.push(name);
            ByKernel::default()
        });
        k.n += 1;
        k.run += r;
        k.gap += g;
        k.tail += l.end as i64 - l.last as i64;
        k.blocks += l.blocks;
    }
    let total = (last.end as i64 - first.first as i64).max(1);
    let us = |ns: i64| ns as f64 / 1e3;
    let pct = |ns: i64| 100.0 * ns as f64 / total as f64;
    let _ = writeln!(
        s,
        "timeline: one replayed decode step, {} launches, {:.1} us from the first kernel's first block to the last one's end ({})",
        launches.len(),
        us(total),
        path.display()
    );
    let _ = writeln!(
        s,
        "  in the kernels (first block past the wait .. last warp's end): {:.1} us ({:.0}%); between them (last warp's end .. next kernel's first block past its wait): {:.1} us ({:.0}%)",
        us(run),
        pct(run),
        us(gap),
        pct(gap)
    );
    let _ = writeln!(
        s,
        "  {:<28} {:>5} {:>8} {:>9} {:>9} {:>9} {:>7}",
        "kernel", "n", "blocks", "run us", "gap us", "tail us", "share"
    );
    for name in order {
        let k = &by[name];
        let n = k.n as f64;
        let _ = writeln!(
            s,
            "  {:<28} {:>5} {:>8.0} {:>9.2} {:>9.2} {:>9.2} {:>6.1}%",
            name,
            k.n,
            k.blocks as f64 / n,
            us(k.run) / n,
            us(k.gap) / n,
            us(k.tail) / n,
            pct(k.run + k.gap)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps as common.cuh writes them: two launches, the first over two copies.
    #[test]
    fn stamps_combine_by_launch_in_order() {
        let mut raw = vec![0u64; SLOTS * SUBS * FIELDS];
        let mut put = |slot: usize, sub: usize, f: [u64; 7]| {
            let at = (slot * SUBS + sub) * FIELDS;
            raw[at..at + 7].copy_from_slice(&f);
        };
        // grid 7 (slot 7): blocks in two copies; grid 6 (slot 6) one copy
        put(7, 0, [8, !1000, !1100, 1200, 1500, 2, 1000]);
        put(7, 5, [8, !990, !1150, 1300, 1450, 1, 1020]);
        put(6, 3, [7, !100, !200, 300, 900, 4, 150]);
        let l = launches(&raw);
        assert_eq!(
            l,
            vec![
                Launch {
                    grid: 6,
                    arrived: 100,
                    arrived_last: 150,
                    first: 200,
                    last: 300,
                    end: 900,
                    blocks: 4
                },
                Launch {
                    grid: 7,
                    arrived: 990,
                    arrived_last: 1020,
                    first: 1100,
                    last: 1300,
                    end: 1500,
                    blocks: 3
                },
            ]
        );
        let names = vec!["norm".to_string(), "mv".to_string()];
        let c = csv(&l, &names);
        assert!(
            c.lines().nth(2) == Some("1,mv,3,790,820,900,1100,1300,400,200"),
            "{c}"
        );
        let s = summary(&l, &names, std::path::Path::new("t.csv"));
        // 1.3 us in all: 0.7 + 0.4 in the kernels, 0.2 between them
        assert!(s.contains("2 launches, 1.3 us"), "{s}");
        assert!(
            s.contains("1.1 us (85%)") && s.contains("0.2 us (15%)"),
            "{s}"
        );
    }
}
