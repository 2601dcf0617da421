//! The coroutine bridge between rustls's synchronous crypto calls and the async engine.
//!
//! [`run`] executes a closure on a pooled coroutine stack. Inside it, [`call`] suspends the
//! coroutine and hands the request out to [`run`]'s caller, which awaits the engine and
//! resumes the coroutine with the answer: the same shape as OpenSSL's ASYNC_JOB fibers.
//! Outside a coroutine, [`call`] computes the operation synchronously.
//!
//! [`ask`] suspends the same way for a question that is not crypto, answered by the
//! driver's `ask` closure ([`run_asking`]): a QUIC handshake's admission, which can only
//! be decided once rustls has read the ClientHello, inside the coroutine.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::ptr;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use terminus_engine::{scalar, CryptoError, CryptoOp, CryptoOutput};
use terminus_metrics::{Counter, Exposition, Render};

type Answer = Result<CryptoOutput, CryptoError>;
type BridgeYielder = Yielder<Option<Resumed>, Suspended>;

/// What a coroutine suspends for.
enum Suspended {
    Crypto(CryptoOp),
    Ask(Box<dyn Any>),
}

/// What it is resumed with.
enum Resumed {
    Crypto(Answer),
    Told(Option<Box<dyn Any>>),
}

/// Coroutine stack size. rustls's handshake code needs far less; the stack is mapped
/// lazily, and a guard page below it turns an overflow into a fault, not corruption.
const STACK_SIZE: usize = 256 * 1024;
/// Stacks kept per thread for reuse.
const POOL_LIMIT: usize = 1024;
/// Stacks [`trim_idle_stacks`] always leaves: light load never maps one.
const POOL_FLOOR: usize = 32;

thread_local! {
    /// The yielder of the coroutine running on this thread right now, or null.
    static ACTIVE: Cell<*const BridgeYielder> = const { Cell::new(ptr::null()) };
    static STACKS: RefCell<StackPool> = const { RefCell::new(StackPool::new()) };
}

/// The thread's spare stacks, most recently used last. A burst of handshakes leaves as
/// many stacks as it ran at once, each with the pages it touched resident (16 KiB each:
/// 1,000 connections at once with the multibuffer backend left 819, 13 MB); the ones a
/// whole trim interval did not need are unmapped at the next trim, the way an
/// allocator's decay gives back what a burst took.
struct StackPool {
    stacks: Vec<DefaultStack>,
    /// The fewest stacks the pool held since the last trim: that many went unused.
    low: usize,
}

impl StackPool {
    const fn new() -> Self {
        Self {
            stacks: Vec::new(),
            low: 0,
        }
    }

    fn take(&mut self) -> Option<DefaultStack> {
        let stack = self.stacks.pop();
        self.low = self.low.min(self.stacks.len());
        stack
    }

    fn give(&mut self, stack: DefaultStack) {
        if self.stacks.len() < POOL_LIMIT {
            self.stacks.push(stack);
        }
    }

    /// Unmaps the stacks not taken since the last trim (the coldest, at the front), down
    /// to [`POOL_FLOOR`]; returns how many.
    fn trim(&mut self) -> usize {
        let idle = self.low.min(self.stacks.len().saturating_sub(POOL_FLOOR));
        self.stacks.drain(..idle);
        self.low = self.stacks.len();
        idle
    }
}

/// Gives back the coroutine stacks this thread has not needed since its last call (at
/// least [`POOL_FLOOR`] are kept): call it every few seconds on every thread that runs
/// handshakes. Returns how many stacks were unmapped.
pub fn trim_idle_stacks() -> usize {
    STACKS.with(|s| s.borrow_mut().trim())
}

/// Operations computed synchronously because [`call`] ran outside any coroutine: a
/// process-wide count, rendered by [`BridgeMetrics`].
static SYNC_FALLBACKS: Counter = Counter::new(
    "terminus_crypto_sync_fallbacks_total",
    "Operations computed synchronously outside a handshake coroutine.",
);

/// The bridge's series.
pub struct BridgeMetrics;

impl Render for BridgeMetrics {
    fn render(&self, out: &mut Exposition) {
        SYNC_FALLBACKS.render(out);
    }
}

/// Performs `op`: suspends the running coroutine until its driver supplies the answer, or
/// computes it on the spot when no coroutine is running.
pub fn call(op: CryptoOp) -> Answer {
    match suspend(Suspended::Crypto(op)) {
        Ok(Some(Resumed::Crypto(answer))) => answer,
        Ok(_) => Err(CryptoError::BackendGone("bridge")),
        Err(Suspended::Crypto(op)) => {
            SYNC_FALLBACKS.inc();
            scalar::compute(op)
        }
        Err(Suspended::Ask(_)) => unreachable!("a crypto request was suspended"),
    }
}

/// Asks the driver of the running coroutine `question` and waits for its answer (see
/// [`run_asking`]); `None` outside a coroutine, or when the driver has none.
pub fn ask(question: Box<dyn Any>) -> Option<Box<dyn Any>> {
    match suspend(Suspended::Ask(question)) {
        Ok(Some(Resumed::Told(answer))) => answer,
        _ => None,
    }
}

/// Suspends the running coroutine for `why`; gives `why` back outside a coroutine.
fn suspend(why: Suspended) -> Result<Option<Resumed>, Suspended> {
    let yielder = ACTIVE.with(|a| a.replace(ptr::null()));
    if yielder.is_null() {
        return Err(why);
    }
    // SAFETY: ACTIVE is non-null only between `ActiveYielder::enter` and its drop (or a
    // suspension, which clears it), all inside the coroutine body that owns the yielder,
    // on this thread; the yielder lives for that whole body, so the pointer is valid here.
    let resumed = unsafe { &*yielder }.suspend(why);
    ACTIVE.with(|a| a.set(yielder));
    Ok(resumed)
}

/// Marks a yielder as the running one for the duration of the coroutine body.
struct ActiveYielder;

impl ActiveYielder {
    fn enter(yielder: &BridgeYielder) -> Self {
        ACTIVE.with(|a| a.set(yielder as *const _));
        ActiveYielder
    }
}

impl Drop for ActiveYielder {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(ptr::null()));
    }
}

fn take_stack() -> DefaultStack {
    STACKS
        .with(|s| s.borrow_mut().take())
        .unwrap_or_else(|| DefaultStack::new(STACK_SIZE).expect("mmap of a coroutine stack failed"))
}

fn return_stack(stack: DefaultStack) {
    STACKS.with(|s| s.borrow_mut().give(stack));
}

/// Runs `body` on a coroutine; every [`call`] it makes is answered by `answer(op)`
/// (and every [`ask`] with `None`).
///
/// If the returned future is dropped while the body is suspended (a handshake timeout),
/// the coroutine is unwound and its stack freed.
pub async fn run<T, F, A, Fut>(body: F, answer: A) -> T
where
    T: 'static,
    F: FnOnce() -> T + 'static,
    A: FnMut(CryptoOp) -> Fut,
    Fut: Future<Output = Answer>,
{
    run_asking(body, answer, |_| std::future::ready(None)).await
}

/// [`run`], every [`ask`] the body makes answered by `told(question)`.
pub async fn run_asking<T, F, A, Fut, Q, QFut>(body: F, mut answer: A, mut told: Q) -> T
where
    T: 'static,
    F: FnOnce() -> T + 'static,
    A: FnMut(CryptoOp) -> Fut,
    Fut: Future<Output = Answer>,
    Q: FnMut(Box<dyn Any>) -> QFut,
    QFut: Future<Output = Option<Box<dyn Any>>>,
{
    let mut coroutine = Coroutine::with_stack(take_stack(), move |yielder: &BridgeYielder, _| {
        let _active = ActiveYielder::enter(yielder);
        body()
    });
    let mut input = None;
    loop {
        match coroutine.resume(input) {
            CoroutineResult::Yield(Suspended::Crypto(op)) => {
                input = Some(Resumed::Crypto(answer(op).await))
            }
            CoroutineResult::Yield(Suspended::Ask(question)) => {
                input = Some(Resumed::Told(told(question).await))
            }
            CoroutineResult::Return(value) => {
                return_stack(coroutine.into_stack());
                return value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terminus_engine::KxGroup;

    fn kx() -> CryptoOp {
        CryptoOp::KxGenerate {
            group: KxGroup::X25519,
        }
    }

    #[test]
    fn call_outside_coroutine_computes_synchronously() {
        let before = SYNC_FALLBACKS.get();
        assert!(matches!(call(kx()), Ok(CryptoOutput::KeyPair { .. })));
        assert!(SYNC_FALLBACKS.get() > before);
    }

    #[test]
    fn calls_inside_coroutine_go_to_the_answerer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut asked = 0;
        let out = rt.block_on(run(
            || {
                let a = call(kx()).is_ok();
                let b = call(kx()).is_ok();
                (a, b)
            },
            |op| {
                asked += 1;
                async move {
                    tokio::task::yield_now().await;
                    scalar::compute(op)
                }
            },
        ));
        assert_eq!(out, (true, true));
        assert_eq!(asked, 2);
    }

    #[test]
    fn questions_go_to_the_driver_and_crypto_still_to_the_answerer() {
        assert!(
            ask(Box::new(2u32)).is_none(),
            "no driver outside a coroutine"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt.block_on(run_asking(
            || {
                let told = ask(Box::new(2u32)).and_then(|a| a.downcast::<u32>().ok());
                (told.map(|t| *t), call(kx()).is_ok())
            },
            |op| std::future::ready(scalar::compute(op)),
            |question| async move {
                tokio::task::yield_now().await;
                let n = question.downcast::<u32>().ok()?;
                Some(Box::new(*n * 2) as Box<dyn Any>)
            },
        ));
        assert_eq!(out, (Some(4), true));
        // `run` tells nothing.
        let out = rt.block_on(run(
            || ask(Box::new(2u32)).is_none(),
            |op| std::future::ready(scalar::compute(op)),
        ));
        assert!(out);
    }

    /// A burst's stacks outlive it by one trim interval, then the ones an interval did not
    /// take go, down to the floor; the stacks in use during the interval stay.
    #[test]
    fn stacks_a_whole_interval_did_not_need_are_unmapped_at_the_next_trim() {
        use corosensei::stack::Stack;
        let mut pool = StackPool::new();
        let new = || DefaultStack::new(STACK_SIZE).unwrap();
        // A burst: 100 handshakes at once, all done.
        for _ in 0..100 {
            pool.give(new());
        }
        // Within the interval the burst came in, nothing was idle all along.
        assert_eq!(pool.trim(), 0);
        assert_eq!(pool.stacks.len(), 100);
        // The next interval, 80 at once at its busiest: 20 were never taken.
        let busy: Vec<DefaultStack> = (0..80).map(|_| pool.take().unwrap()).collect();
        let warm: Vec<usize> = busy.iter().map(|s| s.base().get()).collect();
        busy.into_iter().for_each(|s| pool.give(s));
        assert_eq!(pool.trim(), 20);
        // The ones that went are the cold ones: every stack used in the interval stayed.
        let kept: Vec<usize> = pool.stacks.iter().map(|s| s.base().get()).collect();
        assert!(
            warm.iter().all(|b| kept.contains(b)),
            "a warm stack was unmapped"
        );
        // A quiet interval: all but the floor go, and the floor stays.
        let s = pool.take().unwrap();
        pool.give(s);
        assert_eq!(pool.trim(), 80 - POOL_FLOOR);
        assert_eq!(pool.stacks.len(), POOL_FLOOR);
        assert_eq!(pool.trim(), 0, "the floor is never trimmed");
    }

    #[test]
    fn dropped_suspended_coroutine_unwinds_and_clears_state() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let fut = run(
                || call(kx()).is_ok(),
                |_op| std::future::pending::<Answer>(),
            );
            let r = tokio::time::timeout(std::time::Duration::from_millis(10), fut).await;
            assert!(r.is_err());
        });
        assert!(ACTIVE.with(|a| a.get().is_null()));
    }
}
