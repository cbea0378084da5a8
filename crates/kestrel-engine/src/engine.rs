//! The engine: a handle for front ends and the one scheduler thread behind it.
//!
//! `submit` validates a request and pushes it into an inbox under a mutex; the scheduler thread
//! drains the inbox between steps, runs steps while it has work, publishes a stats snapshot
//! after each, and sleeps on a condvar when idle (after checking its pool accounting, which
//! `check_idle_accounting` reports).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use kestrel_sampler::Sampler;
use kestrel_tokenizer::Tokenizer;

use crate::config::{EngineConfig, SpecMode};
use crate::error::{ConfigError, SubmitError};
use crate::model::StepModel;
use crate::request::{GenerateRequest, RequestHandle};
use crate::scheduler::Scheduler;
use crate::sequence::Pending;
use crate::stats::EngineStats;

struct State {
    inbox: VecDeque<Pending>,
    shutdown: bool,
    /// The scheduler has no work and the inbox is empty.
    idle: bool,
    /// The scheduler thread has exited (shutdown or panic).
    dead: bool,
    stats: EngineStats,
    /// The pool check the scheduler ran when it last went idle.
    accounting: Result<(), String>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the scheduler (new request, shutdown).
    wake: Condvar,
    /// Wakes waiters for idleness.
    idle: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the state stays usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The serving engine. Owns one scheduler thread; dropping the engine stops it (requests still
/// queued or running get `Event::Error`).
pub struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    cfg: EngineConfig,
    n_blocks: usize,
    vocab: usize,
    next_id: AtomicU64,
}

impl Engine {
    /// Starts the scheduler thread. The configuration is normalized first (block size taken
    /// from the model, zero limits raised to 1, step budget raised to `max_running`); use
    /// [`Engine::try_start`] to have a bad configuration refused instead.
    pub fn start(
        model: Box<dyn StepModel>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
    ) -> Engine {
        let mut cfg = cfg.normalized(model.block_size());
        if model.state_slots() > 0 {
            // A hybrid model runs at most one sequence per state slot.
            cfg.max_running = cfg.max_running.min(model.state_slots());
            cfg.step_token_budget = cfg.step_token_budget.max(cfg.max_running);
        }
        let no_spare_slot = model.state_slots() > 0 && model.state_slots() <= cfg.max_running;
        if no_spare_slot || cfg.spec.mode == SpecMode::Draft {
            // No slot to back a recurrent state up in; no draft model given.
            cfg.spec.mode = SpecMode::Off;
        }
        Self::spawn(model, None, tokenizer, cfg)
    }

    /// Starts the scheduler thread after validating `cfg` against the model.
    pub fn try_start(
        model: Box<dyn StepModel>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
    ) -> Result<Engine, ConfigError> {
        Self::try_start_with_draft(model, None, tokenizer, cfg)
    }

    /// [`Engine::try_start`] with a draft model for `SpecMode::Draft`: same vocabulary, same
    /// block size, at least as many KV blocks as `model` (it stores its K/V under the same
    /// block ids).
    pub fn try_start_with_draft(
        model: Box<dyn StepModel>,
        draft: Option<Box<dyn StepModel>>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
    ) -> Result<Engine, ConfigError> {
        cfg.validate(model.block_size())?;
        check_speculation(model.as_ref(), draft.as_deref(), &cfg)?;
        if model.kv_blocks() == 0 {
            return Err(ConfigError::EmptyPool);
        }
        if let Some(why) = model.unsupported() {
            return Err(ConfigError::UnsupportedModel(why));
        }
        let slots = model.state_slots();
        if slots > 0 && slots < cfg.max_running {
            return Err(ConfigError::StateSlots {
                slots,
                max_running: cfg.max_running,
            });
        }
        Ok(Self::spawn(model, draft, tokenizer, cfg))
    }

    fn spawn(
        model: Box<dyn StepModel>,
        draft: Option<Box<dyn StepModel>>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
    ) -> Engine {
        let n_blocks = model.kv_blocks();
        let vocab = model.vocab_size();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                inbox: VecDeque::new(),
                shutdown: false,
                idle: true,
                dead: false,
                stats: EngineStats {
                    blocks_total: n_blocks,
                    blocks_free: n_blocks,
                    ..Default::default()
                },
                accounting: Ok(()),
            }),
            wake: Condvar::new(),
            idle: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        let thread_cfg = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("kestrel-scheduler".to_string())
            .spawn(move || scheduler_loop(&thread_shared, model, draft, &tokenizer, thread_cfg))
            .ok();
        if thread.is_none() {
            let mut st = shared.lock();
            st.dead = true;
        }
        Engine {
            shared,
            thread,
            cfg,
            n_blocks,
            vocab,
            next_id: AtomicU64::new(1),
        }
    }

    /// The configuration in use (after normalization).
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Refuses at once (with a message saying what would fit) a request that can never fit;
    /// otherwise queues it.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestHandle, SubmitError> {
        self.check_fits(&req)?;
        let sampler = Sampler::new(req.sampling.clone(), self.vocab)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let pending = Pending {
            req,
            sampler,
            tx,
            cancel: Arc::clone(&cancel),
            submitted: Instant::now(),
        };
        {
            let mut st = self.shared.lock();
            if st.shutdown || st.dead {
                return Err(SubmitError::ShutDown);
            }
            st.inbox.push_back(pending);
            st.idle = false;
        }
        self.shared.wake.notify_one();
        Ok(RequestHandle {
            id,
            events: rx,
            cancel,
        })
    }

    /// The checks `submit` makes before queueing.
    fn check_fits(&self, req: &GenerateRequest) -> Result<(), SubmitError> {
        let prompt = req.prompt.len();
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::ZeroMaxTokens);
        }
        if let Some((index, &id)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.vocab)
        {
            return Err(SubmitError::TokenOutOfRange {
                index,
                id,
                vocab: self.vocab,
            });
        }
        let total = prompt.saturating_add(req.max_tokens);
        let ctx = self.cfg.ctx_size;
        if total > ctx {
            let hint = if prompt < ctx {
                format!(
                    "with this prompt at most max_tokens = {} fits",
                    ctx - prompt
                )
            } else {
                format!("the prompt must be at most {} tokens", ctx - 1)
            };
            return Err(SubmitError::ContextExceeded {
                prompt,
                max_tokens: req.max_tokens,
                total,
                ctx_size: ctx,
                hint,
            });
        }
        let bs = self.cfg.block_size;
        let needed_blocks = total.div_ceil(bs);
        if needed_blocks > self.n_blocks {
            let pool_tokens = self.n_blocks * bs;
            let hint = if prompt < pool_tokens {
                format!(
                    "with this prompt at most max_tokens = {} fits",
                    pool_tokens - prompt
                )
            } else {
                format!("the prompt must be at most {} tokens", pool_tokens - 1)
            };
            return Err(SubmitError::PoolTooSmall {
                prompt,
                max_tokens: req.max_tokens,
                needed_blocks,
                block_size: bs,
                pool_blocks: self.n_blocks,
                pool_tokens,
                hint,
            });
        }
        Ok(())
    }

    /// Blocks free/used/cached, queue depth, running, and cumulative counters, as of the last
    /// step.
    pub fn stats(&self) -> EngineStats {
        let st = self.shared.lock();
        let mut s = st.stats.clone();
        s.queue_depth += st.inbox.len();
        s
    }

    /// Waits until idle and checks every block is free or cached (none leaked), no reference
    /// or reservation is left, and the prefix index is consistent.
    pub fn check_idle_accounting(&self) -> Result<(), String> {
        let mut st = self.shared.lock();
        while !(st.dead || st.idle && st.inbox.is_empty()) {
            st = self.shared.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.dead && !st.shutdown {
            return Err("the scheduler thread has died".to_string());
        }
        st.accounting.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Marks the engine dead when the scheduler thread exits, even by a panic, so waiters wake.
struct DeadOnExit<'a>(&'a Shared);

impl Drop for DeadOnExit<'_> {
    fn drop(&mut self) {
        self.0.lock().dead = true;
        self.0.idle.notify_all();
    }
}

fn scheduler_loop(
    shared: &Shared,
    model: Box<dyn StepModel>,
    draft: Option<Box<dyn StepModel>>,
    tokenizer: &Tokenizer,
    cfg: EngineConfig,
) {
    let _guard = DeadOnExit(shared);
    let mut sched = Scheduler::new(model, draft, tokenizer, cfg);
    loop {
        {
            let mut st = shared.lock();
            loop {
                for p in st.inbox.drain(..) {
                    sched.enqueue(p);
                }
                if st.shutdown {
                    drop(st);
                    sched.abort_all("the engine is shutting down");
                    return;
                }
                if sched.has_work() {
                    st.idle = false;
                    break;
                }
                // Idle: check the books, tell waiters, sleep until woken.
                st.accounting = sched.check_idle();
                st.stats = sched.stats();
                st.idle = true;
                shared.idle.notify_all();
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        sched.step();
        let stats = sched.stats();
        shared.lock().stats = stats;
    }
}

/// What speculative decoding needs of the models: a target whose positions can be rolled back
/// (a hybrid target's recurrent state needs a spare state slot to be backed up in), and for
/// draft mode a compatible draft model without recurrent state.
fn check_speculation(
    model: &dyn StepModel,
    draft: Option<&dyn StepModel>,
    cfg: &EngineConfig,
) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError::Speculation(m));
    let mode = cfg.spec.mode;
    let slots = model.state_slots();
    if mode != SpecMode::Off && slots > 0 && slots <= cfg.max_running {
        return err(format!(
            "the model keeps a recurrent state (hybrid layers): speculation backs a sequence's \
             state up before each verify pass, and the memory plan left no spare state slot \
             ({slots} for {} running sequences); raise --max-memory or use --spec off",
            cfg.max_running
        ));
    }
    match (mode, draft) {
        (SpecMode::Draft, None) => err("--spec draft needs a draft model (--draft-model)".into()),
        (SpecMode::Draft, Some(d)) => {
            if d.vocab_size() != model.vocab_size() {
                return err(format!(
                    "the draft model's vocabulary ({} tokens) differs from the model's ({})",
                    d.vocab_size(),
                    model.vocab_size()
                ));
            }
            if d.block_size() != model.block_size() || d.kv_blocks() < model.kv_blocks() {
                return err(format!(
                    "the draft model's KV pool ({} blocks of {}) must match the model's ({} of {})",
                    d.kv_blocks(),
                    d.block_size(),
                    model.kv_blocks(),
                    model.block_size()
                ));
            }
            if d.state_slots() > 0 {
                return err("a hybrid (recurrent) draft model cannot be rolled back".into());
            }
            Ok(())
        }
        (_, Some(_)) => err("a draft model was given but speculation is not `draft`".into()),
        (_, None) => Ok(()),
    }
}
