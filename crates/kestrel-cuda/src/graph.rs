//! A decode step captured into a CUDA graph, with programmatic edges between kestrel's kernels.
//!
//! A captured step is a chain of ~10 kernels per layer, many of them a few microseconds long:
//! with plain edges each one starts only after the one before it has drained its last block,
//! so every link pays the launch latency and the next kernel's first DRAM round trip. On sm_90+
//! the chain's kernel -> kernel edges whose target is one of ours become programmatic
//! (`CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC` from the source's programmatic port): the next
//! kernel's blocks are scheduled as soon as every block of the previous one has started, run up
//! to `GRID_DEP()` (kernels/common.cuh; the one-token mat-vecs prefetch their first weight bytes
//! into L2 before it) and wait there until the previous kernel has finished and its writes are
//! visible. Every kernel of ours calls `GRID_DEP()` first, so each link still orders what
//! it reads after what the link before it wrote; kernels not ours (cuBLAS) keep plain edges.
//! `KESTREL_CUDA_PDL=0` keeps every edge plain (A/B figures).

use crate::device::Gpu;
use crate::error::{CudaError, Result};
use cudarc::driver::sys;
use std::collections::HashSet;

/// An instantiated graph and the graph it came from (both freed on drop).
pub(crate) struct StepGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Edges made programmatic at instantiation.
    pub programmatic_edges: usize,
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by `end_capture` and are destroyed only here.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

impl StepGraph {
    /// Replays the step on the GPU's stream.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        // SAFETY: `exec` is a live instantiated graph; the stream belongs to the same context.
        unsafe { sys::cuGraphLaunch(self.exec, gpu.stream.cu_stream()) }.result()?;
        Ok(())
    }
}

/// Whether captured steps get programmatic edges: on devices of compute capability 9.0+
/// (`griddepcontrol`), unless `KESTREL_CUDA_PDL=0`.
pub(crate) fn programmatic_launch(gpu: &Gpu) -> bool {
    let major = gpu
        .arch
        .strip_prefix("sm_")
        .and_then(|s| s.get(..s.len().saturating_sub(1)))
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(0);
    major >= 9 && std::env::var("KESTREL_CUDA_PDL").map_or(true, |v| v != "0")
}

/// Ends the capture begun on `gpu.stream` and instantiates it; with `programmatic`, the
/// kernel -> kernel edges into the kernels in `ours` become programmatic first.
pub(crate) fn end_capture(
    gpu: &Gpu,
    ours: &HashSet<usize>,
    programmatic: bool,
) -> Result<StepGraph> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: the stream is capturing (the caller began it); on success we own `graph`.
    unsafe { sys::cuStreamEndCapture(gpu.stream.cu_stream(), &mut graph) }.result()?;
    if graph.is_null() {
        return Err(CudaError::Other("an empty CUDA graph".into()));
    }
    let mut made = StepGraph {
        graph,
        exec: std::ptr::null_mut(),
        programmatic_edges: 0,
    };
    if programmatic {
        made.programmatic_edges = make_programmatic(graph, ours)?;
    }
    // SAFETY: `graph` is a complete captured graph; on success we own `exec` (freed on drop).
    unsafe { sys::cuGraphInstantiateWithFlags(&mut made.exec, graph, 0) }.result()?;
    Ok(made)
}

/// Rewrites every plain kernel -> kernel edge whose target runs one of `ours` as a
/// programmatic edge; returns how many it rewrote.
fn make_programmatic(graph: sys::CUgraph, ours: &HashSet<usize>) -> Result<usize> {
    let (from, to, data) = edges(graph)?;
    let n = from.len();
    let programmatic = edge(
        sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
        sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
    );
    let mut rewritten = 0;
    for i in 0..n {
        if data[i].type_ != 0
            || !is_kernel(from[i])?
            || kernel_func(to[i])?.is_none_or(|f| !ours.contains(&f))
        {
            continue;
        }
        // SAFETY: the edge (from[i], to[i], data[i]) exists in `graph`; it is replaced by the
        // same pair with programmatic edge data.
        unsafe {
            sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1).result()?;
            sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &programmatic, 1).result()?;
        }
        rewritten += 1;
    }
    Ok(rewritten)
}

impl StepGraph {
    /// The function (address) of every kernel node, in the order the graph runs them (a
    /// topological order: a captured step is one chain).
    pub fn kernel_order(&self) -> Result<Vec<usize>> {
        let mut n = 0usize;
        // SAFETY: size queries (null arrays) of a live graph.
        unsafe {
            sys::cuGraphGetNodes(self.graph, std::ptr::null_mut(), &mut n).result()?;
        }
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: the array holds `n` entries.
        unsafe { sys::cuGraphGetNodes(self.graph, nodes.as_mut_ptr(), &mut n) }.result()?;
        let (from, to, _) = edges(self.graph)?;
        // Kahn's algorithm over node indices
        let index = |p: sys::CUgraphNode| nodes.iter().position(|&q| q == p);
        let mut succ = vec![Vec::new(); n];
        let mut preds = vec![0usize; n];
        for (&f, &t) in from.iter().zip(&to) {
            if let (Some(f), Some(t)) = (index(f), index(t)) {
                succ[f].push(t);
                preds[t] += 1;
            }
        }
        let mut ready: Vec<usize> = (0..n).filter(|&i| preds[i] == 0).rev().collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop() {
            if let Some(f) = kernel_func(nodes[i])? {
                order.push(f);
            }
            for &t in succ[i].iter().rev() {
                preds[t] -= 1;
                if preds[t] == 0 {
                    ready.push(t);
                }
            }
        }
        Ok(order)
    }
}

/// A graph's edges: their sources, targets and data.
type Edges = (
    Vec<sys::CUgraphNode>,
    Vec<sys::CUgraphNode>,
    Vec<sys::CUgraphEdgeData>,
);

fn edges(graph: sys::CUgraph) -> Result<Edges> {
    let mut n = 0usize;
    // SAFETY: a size query (null arrays) of a live graph.
    unsafe {
        sys::cuGraphGetEdges_v2(
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut n,
        )
    }
    .result()?;
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    let mut data = vec![edge(0, 0); n];
    // SAFETY: the three arrays hold `n` entries each.
    unsafe {
        sys::cuGraphGetEdges_v2(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        )
    }
    .result()?;
    from.truncate(n);
    to.truncate(n);
    data.truncate(n);
    Ok((from, to, data))
}

fn edge(from_port: u8, type_: u8) -> sys::CUgraphEdgeData {
    sys::CUgraphEdgeData {
        from_port,
        to_port: 0,
        type_,
        reserved: [0; 5],
    }
}

fn is_kernel(node: sys::CUgraphNode) -> Result<bool> {
    let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `node` is a node of a live graph.
    unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result()?;
    Ok(ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
}

/// The function a kernel node runs (as an address), or None for another kind of node.
fn kernel_func(node: sys::CUgraphNode) -> Result<Option<usize>> {
    if !is_kernel(node)? {
        return Ok(None);
    }
    type GetParams = unsafe extern "C" fn(
        sys::CUgraphNode,
        *mut sys::CUDA_KERNEL_NODE_PARAMS_v2_st,
    ) -> sys::CUresult;
    // cudarc's CUDA 13.0 bindings leave this entry point out; the driver has exported it
    // since CUDA 12.0.
    // SAFETY: the symbol has this C signature in every driver that exports it.
    let get: GetParams = unsafe {
        *sys::culib()
            .get::<GetParams>(b"cuGraphKernelNodeGetParams_v2\0")
            .map_err(|e| CudaError::Other(format!("cuGraphKernelNodeGetParams_v2: {e}")))?
    };
    // SAFETY: a plain C struct of pointers and integers; all-zero is a valid value to fill.
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS_v2_st = unsafe { std::mem::zeroed() };
    // SAFETY: `node` is a kernel node; `p` is written by the driver.
    unsafe { get(node, &mut p) }.result()?;
    Ok(Some(p.func as usize))
}
