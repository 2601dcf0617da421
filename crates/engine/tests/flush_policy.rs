//! The engine's queueing and flush policy, with a backend that batches (computing with
//! the real scalar code) and tokio's paused clock for the deadline.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use terminus_engine::{
    scalar, Backend, BackendKind, CryptoError, CryptoOp, CryptoOutput, Engine, EngineMetrics,
    FlushPolicy, HandshakeContext, Job, KxGroup, OpKind,
};
use tokio::time::Instant;

/// Computes batches of up to `size` (1 for signatures, as a backend without a batched
/// form for them would) with the scalar code and records each batch's size.
struct Batching {
    size: usize,
    batches: Rc<RefCell<Vec<usize>>>,
}

impl Backend for Batching {
    fn kind(&self) -> BackendKind {
        BackendKind::Scalar
    }
    fn max_batch(&self, op: OpKind) -> usize {
        match op {
            OpKind::EcdsaSign => 1,
            _ => self.size,
        }
    }
    fn dispatch(&self, batch: Vec<Job>) {
        self.batches.borrow_mut().push(batch.len());
        for job in batch {
            let (op, reply) = job.into_parts();
            reply.complete(scalar::compute(op));
        }
    }
}

const DELAY: Duration = Duration::from_millis(5);

fn engine(size: usize) -> (Engine, Rc<RefCell<Vec<usize>>>) {
    let batches = Rc::new(RefCell::new(Vec::new()));
    let backend = Batching {
        size,
        batches: batches.clone(),
    };
    let metrics = Arc::new(EngineMetrics::new(BackendKind::Scalar));
    (
        Engine::new(
            Box::new(backend),
            FlushPolicy {
                max_batch_delay: DELAY,
            },
            metrics,
        ),
        batches,
    )
}

fn kx() -> CryptoOp {
    CryptoOp::KxGenerate {
        group: KxGroup::X25519,
    }
}

fn local<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, f)
}

/// Like [`local`], on a runtime that tells the engine when its loop is about to sleep, as
/// a worker's does.
fn worker<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .on_thread_park(terminus_engine::worker_idle)
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, f)
}

/// Submits `n` requests concurrently and collects their results.
async fn submit_many(engine: &Engine, n: usize) -> Vec<Result<CryptoOutput, CryptoError>> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let e = engine.clone();
            tokio::task::spawn_local(async move {
                e.submit(kx(), &HandshakeContext::starting_now()).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[test]
fn full_batch_flushes_at_once() {
    local(async {
        let (engine, batches) = engine(4);
        // Eight handshakes in flight, four asking: the queue fills and goes.
        let _guards: Vec<_> = (0..8).map(|_| engine.handshake_started()).collect();
        let start = Instant::now();
        let results = submit_many(&engine, 4).await;
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(*batches.borrow(), vec![4]);
        assert!(start.elapsed() < DELAY, "did not wait for the deadline");
    });
}

#[test]
fn everyone_parked_flushes_a_partial_batch() {
    local(async {
        let (engine, batches) = engine(8);
        let _a = engine.handshake_started();
        let _b = engine.handshake_started();
        let start = Instant::now();
        // Both handshakes in flight ask: nobody else can join, so no waiting.
        let results = submit_many(&engine, 2).await;
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(*batches.borrow(), vec![2]);
        assert!(start.elapsed() < DELAY);
    });
}

/// One handshake asks while another is in flight but not parked (still reading from its
/// socket, or waiting a round trip for its client's next flight): how long the request
/// waited, after checking it went alone.
async fn lone_request_wait() -> std::time::Duration {
    let (engine, batches) = engine(8);
    let _asking = engine.handshake_started();
    let _busy = engine.handshake_started();
    let start = Instant::now();
    assert!(engine
        .submit(kx(), &HandshakeContext::starting_now())
        .await
        .is_ok());
    assert_eq!(*batches.borrow(), vec![1]);
    start.elapsed()
}

#[test]
fn lone_request_waits_at_most_the_deadline() {
    let waited = local(lone_request_wait());
    assert!(waited >= DELAY && waited < DELAY * 2, "waited {waited:?}");
}

#[test]
fn finishing_handshake_releases_the_waiting_batch() {
    local(async {
        let (engine, batches) = engine(8);
        let _asking = engine.handshake_started();
        let other = engine.handshake_started();
        let e = engine.clone();
        let waiter = tokio::task::spawn_local(async move {
            e.submit(kx(), &HandshakeContext::starting_now()).await
        });
        tokio::task::yield_now().await;
        assert!(
            batches.borrow().is_empty(),
            "partial batch held while another handshake runs"
        );
        // The other handshake ends: everyone left is parked, so flush now.
        let start = Instant::now();
        drop(other);
        assert!(waiter.await.unwrap().is_ok());
        assert!(start.elapsed() < DELAY);
        assert_eq!(*batches.borrow(), vec![1]);
    });
}

#[test]
fn a_full_queue_does_not_flush_the_others() {
    local(async {
        let (engine, batches) = engine(8);
        let _guards: Vec<_> = (0..4).map(|_| engine.handshake_started()).collect();
        // One key exchange waits for company...
        let e = engine.clone();
        let waiting = tokio::task::spawn_local(async move {
            e.submit(kx(), &HandshakeContext::starting_now()).await
        });
        tokio::task::yield_now().await;
        // ...while a signature, whose queue is full at one, goes at once.
        let dir = std::env::temp_dir().join(format!("terminus-flush-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("k.pem");
        let ok = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-outform",
                "DER",
                "-out",
            ])
            .arg(&pem)
            .status()
            .unwrap();
        assert!(ok.success());
        let key = Arc::new(
            terminus_engine::SigningKeyPair::from_der(&std::fs::read(&pem).unwrap()).unwrap(),
        );
        let _ = std::fs::remove_dir_all(&dir);
        let sign = CryptoOp::Sign {
            key,
            scheme: rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
            message: b"m".to_vec(),
        };
        assert!(engine
            .submit(sign, &HandshakeContext::starting_now())
            .await
            .is_ok());
        assert_eq!(
            *batches.borrow(),
            vec![1],
            "only the signature was computed"
        );
        assert!(
            !waiting.is_finished(),
            "the key exchange kept waiting for its batch"
        );
        assert!(waiting.await.unwrap().is_ok());
        assert_eq!(*batches.borrow(), vec![1, 1]);
    });
}

#[test]
fn scalar_backend_never_queues() {
    local(async {
        let metrics = Arc::new(EngineMetrics::new(BackendKind::Scalar));
        let engine = Engine::new(
            Box::new(terminus_engine::ScalarBackend),
            FlushPolicy::default(),
            metrics.clone(),
        );
        // Another handshake is in flight and not waiting: a batching backend would hold
        // this request for company until the deadline (the paused clock would jump to it).
        let _g = (engine.handshake_started(), engine.handshake_started());
        let start = Instant::now();
        assert!(engine
            .submit(kx(), &HandshakeContext::starting_now())
            .await
            .is_ok());
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the request waited in a queue"
        );
        assert_eq!(metrics.requests(OpKind::X25519), 1);
        assert_eq!(metrics.batches(OpKind::X25519), 1);
    });
}

#[test]
fn an_idle_worker_does_not_hold_a_partial_batch() {
    let waited = worker(lone_request_wait());
    assert!(
        waited < DELAY,
        "the worker had nothing else to do, yet the request waited {waited:?}"
    );
}

#[test]
fn a_busy_worker_gathers_a_batch_until_the_deadline() {
    worker(async {
        let (engine, batches) = engine(8);
        let _guards: Vec<_> = (0..3).map(|_| engine.handshake_started()).collect();
        // Other work for twice the DELAY, in slices: the loop never idles meanwhile.
        let busy = tokio::task::spawn_local(async {
            for _ in 0..100 {
                tokio::time::advance(DELAY / 50).await;
            }
        });
        let start = Instant::now();
        let e = engine.clone();
        let first = tokio::task::spawn_local(async move {
            e.submit(kx(), &HandshakeContext::starting_now()).await
        });
        tokio::time::sleep(DELAY / 5).await;
        assert!(batches.borrow().is_empty(), "held while the worker is busy");
        assert!(engine
            .submit(kx(), &HandshakeContext::starting_now())
            .await
            .is_ok());
        assert!(first.await.unwrap().is_ok());
        assert_eq!(
            *batches.borrow(),
            vec![2],
            "the second request joined the first"
        );
        assert!(start.elapsed() >= DELAY);
        busy.await.unwrap();
    });
}

/// The worker's hook runs once before each batch goes to the backend, each time with
/// that batch still to come (it is how a busy worker turns away connections between its
/// batches), and never for a flush that finds nothing to compute.
#[test]
fn the_before_dispatch_hook_runs_ahead_of_every_batch() {
    local(async {
        let (engine, batches) = engine(4);
        let seen = Rc::new(RefCell::new(Vec::new()));
        let (log, dispatched) = (seen.clone(), batches.clone());
        engine.before_dispatch(move || log.borrow_mut().push(dispatched.borrow().len()));
        let _guards: Vec<_> = (0..20).map(|_| engine.handshake_started()).collect();
        let results = submit_many(&engine, 10).await;
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(*batches.borrow(), vec![4, 4, 2]);
        // Before batch k, k batches had been dispatched.
        assert_eq!(*seen.borrow(), vec![0, 1, 2]);
    });
}

/// A request whose handshake gave up while it waited for its batch (its submit dropped:
/// a handshake timeout, a keyless terminator's deadline) is not computed: the batch
/// that goes holds only the requests still waited for.
#[test]
fn an_abandoned_request_is_not_computed() {
    local(async {
        let (engine, batches) = engine(8);
        let _guards: Vec<_> = (0..4).map(|_| engine.handshake_started()).collect();
        let e = engine.clone();
        let gives_up = tokio::task::spawn_local(async move {
            e.submit(kx(), &HandshakeContext::starting_now()).await
        });
        let e = engine.clone();
        let waits = tokio::task::spawn_local(async move {
            e.submit(kx(), &HandshakeContext::starting_now()).await
        });
        tokio::task::yield_now().await;
        assert!(batches.borrow().is_empty(), "both wait for company");
        gives_up.abort();
        let _ = gives_up.await;
        assert!(waits.await.unwrap().is_ok());
        assert_eq!(
            *batches.borrow(),
            vec![1],
            "only the request still waited for"
        );
    });
}
