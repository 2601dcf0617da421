//! The engine's own test helpers: the counted skip on CPUs without IFMA and a multibuffer
//! engine on a worker-like runtime (scratch directories and openssl: terminus_testkit).
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;

use terminus_engine::cost::Crossovers;
use terminus_engine::{BackendKind, Engine, EngineMetrics, FlushPolicy, MultibufferBackend};

/// True when crypto_mb cannot run on this CPU: the caller returns, and the skip is shown
/// and counted (or fails the test where IFMA is required; see terminus_testkit).
pub fn skip_without_ifma() -> bool {
    !terminus_testkit::runs_with_ifma(terminus_engine::multibuffer::applicable())
}

/// Runs `test` with a multibuffer engine deciding small batches by `crossovers`, on a
/// current-thread runtime inside a `LocalSet`, as a worker runs its engine.
pub fn on_multibuffer_engine<F, Fut>(crossovers: Arc<Crossovers>, test: F) -> Fut::Output
where
    F: FnOnce(Engine, Arc<EngineMetrics>) -> Fut,
    Fut: Future,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async move {
        let metrics = Arc::new(EngineMetrics::new(BackendKind::Multibuffer));
        let backend = MultibufferBackend::new(metrics.clone())
            .expect("crypto_mb runs here")
            .with_crossovers(crossovers);
        let engine = Engine::new(Box::new(backend), FlushPolicy::default(), metrics.clone());
        test(engine, metrics).await
    })
}
