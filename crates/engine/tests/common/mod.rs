//! Shared helpers for the engine's tests: the OpenSSL command line as the independent
//! implementation, temporary directories, the counted skip on CPUs without IFMA, and a
//! multibuffer engine on a worker-like runtime.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use terminus_engine::speed::Crossovers;
use terminus_engine::{BackendKind, Engine, EngineMetrics, FlushPolicy, MultibufferBackend};

/// Runs the openssl CLI and returns its stdout; panics with its stderr on failure.
pub fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl CLI");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A fresh directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "terminus-engine-{}-{name}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
