//! The coroutine bridge between rustls's synchronous crypto calls and the async engine.
//!
//! [`run`] executes a closure on a pooled coroutine stack. Inside it, [`call`] suspends the
//! coroutine and hands the request out to [`run`]'s caller, which awaits the engine and
//! resumes the coroutine with the answer: the same shape as OpenSSL's ASYNC_JOB fibers.
//! Outside a coroutine, [`call`] computes the operation synchronously.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::ptr;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use terminus_engine::{scalar, CryptoError, CryptoOp, CryptoOutput};
use terminus_metrics::{Counter, Exposition, Render};

type Answer = Result<CryptoOutput, CryptoError>;
type BridgeYielder = Yielder<Option<Answer>, CryptoOp>;

/// Coroutine stack size. rustls's handshake code needs far less; the stack is mapped
/// lazily, and a guard page below it turns an overflow into a fault, not corruption.
const STACK_SIZE: usize = 256 * 1024;
/// Stacks kept per thread for reuse.
const POOL_LIMIT: usize = 1024;

thread_local! {
    /// The yielder of the coroutine running on this thread right now, or null.
    static ACTIVE: Cell<*const BridgeYielder> = const { Cell::new(ptr::null()) };
    static STACKS: RefCell<Vec<DefaultStack>> = const { RefCell::new(Vec::new()) };
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
    let yielder = ACTIVE.with(|a| a.replace(ptr::null()));
    if yielder.is_null() {
        SYNC_FALLBACKS.inc();
        return scalar::compute(op);
    }
    // SAFETY: ACTIVE is non-null only between `ActiveYielder::enter` and its drop (or a
    // suspension, which clears it), all inside the coroutine body that owns the yielder,
    // on this thread; the yielder lives for that whole body, so the pointer is valid here.
    let answer = unsafe { &*yielder }.suspend(op);
    ACTIVE.with(|a| a.set(yielder));
    answer.unwrap_or(Err(CryptoError::BackendGone("bridge")))
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
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| DefaultStack::new(STACK_SIZE).expect("mmap of a coroutine stack failed"))
}

fn return_stack(stack: DefaultStack) {
    STACKS.with(|s| {
        let mut pool = s.borrow_mut();
        if pool.len() < POOL_LIMIT {
            pool.push(stack);
        }
    });
}

/// Runs `body` on a coroutine; every [`call`] it makes is answered by `answer(op)`.
///
/// If the returned future is dropped while the body is suspended (a handshake timeout),
/// the coroutine is unwound and its stack freed.
pub async fn run<T, F, A, Fut>(body: F, mut answer: A) -> T
where
    T: 'static,
    F: FnOnce() -> T + 'static,
    A: FnMut(CryptoOp) -> Fut,
    Fut: Future<Output = Answer>,
{
    let mut coroutine = Coroutine::with_stack(take_stack(), move |yielder: &BridgeYielder, _| {
        let _active = ActiveYielder::enter(yielder);
        body()
    });
    let mut input = None;
    loop {
        match coroutine.resume(input) {
            CoroutineResult::Yield(op) => input = Some(answer(op).await),
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
