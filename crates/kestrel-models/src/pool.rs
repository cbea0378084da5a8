//! A small persistent thread pool for data-parallel kernels.
//!
//! Decode issues hundreds of small matmuls per token, so spawning threads per matmul (tens of
//! microseconds each) would cost more than the math. Workers stay alive, spin briefly waiting for
//! the next job, then sleep on a condvar. A job is `n_tasks` calls of one closure; tasks are
//! claimed from one atomic word that packs (job generation, next task index), so a slow worker
//! can never claim a task of a later job with a stale closure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spins before a worker goes to sleep; about tens of microseconds.
const SPIN_LIMIT: u32 = 20_000;

type Task = dyn Fn(usize) + Sync;

struct Job {
    /// Points at a closure that lives on the stack of `ThreadPool::run` for the job's duration.
    task: *const Task,
    n_tasks: usize,
    generation: u64,
}
// SAFETY: the closure is Sync and `run` outlives every use of the pointer (see `run`).
unsafe impl Send for Job {}

struct Shared {
    job: Mutex<Option<Job>>,
    wake: Condvar,
    /// Generation of the latest job (low 32 bits mirror `Job::generation`).
    generation: AtomicU64,
    /// (generation << 32) | next unclaimed task index.
    cursor: AtomicU64,
    done: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Serializes `run` callers (the pool runs one job at a time).
    running: Mutex<()>,
}

impl ThreadPool {
    /// A pool using `n_threads` threads in all (the caller counts as one).
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kestrel-worker-{i}"))
                    .spawn(move || worker_loop(&shared))
                    .expect("spawning a worker thread")
            })
            .collect();
        Self {
            shared,
            workers,
            n_threads,
            running: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Calls `f(i)` for every `i` in `0..n_tasks`, spread over the pool; returns when all are done.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.n_threads == 1 || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let generation = (s.generation.load(Ordering::Relaxed) + 1) as u32 as u64;
        // SAFETY: erase the closure's lifetime; we do not return before every claimed task has
        // finished, and tasks of this generation can no longer be claimed after that.
        let task: *const Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Task>(f) };
        s.done.store(0, Ordering::Relaxed);
        s.cursor.store(generation << 32, Ordering::Release);
        {
            let mut job = s.job.lock().unwrap_or_else(|e| e.into_inner());
            *job = Some(Job {
                task,
                n_tasks,
                generation,
            });
            s.generation.store(generation, Ordering::Release);
        }
        s.wake.notify_all();
        // The caller works too.
        let mine = claim_and_run(s, generation as u32, task, n_tasks);
        if mine > 0 {
            s.done.fetch_add(mine, Ordering::AcqRel);
        }
        // Spin briefly, then yield: when the machine is oversubscribed a spinning caller would
        // burn the time slice the worker it waits for needs.
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < n_tasks {
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("a thread-pool task panicked");
        }
    }
}

/// Claims tasks of `generation` until none are left; returns how many it ran.
fn claim_and_run(s: &Shared, generation: u32, task: *const Task, n_tasks: usize) -> usize {
    let mut ran = 0;
    loop {
        let cur = s.cursor.load(Ordering::Acquire);
        if (cur >> 32) as u32 != generation {
            return ran;
        }
        let idx = (cur & 0xffff_ffff) as usize;
        if idx >= n_tasks {
            return ran;
        }
        if s.cursor
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        // SAFETY: the task index belongs to the live job of this generation (see `run`).
        let f = unsafe { &*task };
        if catch_unwind(AssertUnwindSafe(|| f(idx))).is_err() {
            s.panicked.store(true, Ordering::Release);
        }
        ran += 1;
    }
}

fn worker_loop(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Spin a while for the next job, then sleep.
        let mut spins = 0;
        while s.generation.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Relaxed) {
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
            } else {
                let job = s.job.lock().unwrap_or_else(|e| e.into_inner());
                if s.generation.load(Ordering::Acquire) == seen
                    && !s.shutdown.load(Ordering::Relaxed)
                {
                    drop(s.wake.wait(job).unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        let (task, n_tasks, generation) = {
            let job = s.job.lock().unwrap_or_else(|e| e.into_inner());
            match job.as_ref() {
                Some(j) => (j.task, j.n_tasks, j.generation),
                None => continue,
            }
        };
        seen = generation;
        let ran = claim_and_run(s, generation as u32, task, n_tasks);
        if ran > 0 {
            s.done.fetch_add(ran, Ordering::AcqRel);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _job = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::Release);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer that tasks may share to write disjoint parts of one output buffer.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(pub *mut T);
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(s: &mut [T]) -> Self {
        Self(s.as_mut_ptr())
    }

    /// # Safety
    /// `[start, start+len)` must lie in the original slice and no other task may touch it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = ThreadPool::new(3);
        for n in [1usize, 2, 7, 100, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn a_panicking_task_is_reported_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(8, &|i| assert!(i != 3))));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(8, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }
}
