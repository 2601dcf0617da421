//! One lifecycle for everything that runs from start-up to shutdown: the workers, the
//! crypto threads, the admin listener, the health checks, memory housekeeping, the ACME
//! manager and the fleet's store rounds. Each is a [`Service`]; [`Services`] keeps them in
//! the order they started. At shutdown every one is asked to stop at once (the workers
//! stop accepting and start their drain without waiting for anyone), then each is waited
//! for, the last started first: a service that must outlive another's stop does its
//! stopping in `join` (the crypto threads, which compute what the draining workers
//! still queue).
//!
//! As Pingora's `Service`/`BackgroundService`, but with threads rather than tasks: each
//! worker runs its own single-threaded runtime, and the background services keep theirs
//! off the workers' cores' queues.

use std::io;
use std::thread::JoinHandle;

use tokio::sync::watch;

/// Something that runs until shutdown.
pub(crate) trait Service: Send {
    /// What the log calls it.
    fn name(&self) -> &str;
    /// Asks it to stop: it finishes what it must (the workers' drain, within
    /// `shutdown_grace`) and lets go of its threads and connections. Does not wait.
    fn stop(&mut self);
    /// Waits until it has stopped (called once every service has been asked to).
    fn join(self: Box<Self>);
}

/// The services running, in the order they started.
#[derive(Default)]
pub(crate) struct Services {
    running: Vec<Box<dyn Service>>,
}

impl Services {
    /// Keeps `service` to be stopped at shutdown.
    pub(crate) fn add(&mut self, service: impl Service + 'static) {
        self.running.push(Box::new(service));
    }

    /// Asks every service to stop, then waits for each, the last started first.
    pub(crate) fn stop_all(&mut self) {
        for service in self.running.iter_mut().rev() {
            service.stop();
        }
        while let Some(service) = self.running.pop() {
            let name = service.name().to_owned();
            service.join();
            tracing::debug!("stopped: {name}");
        }
    }
}

impl Drop for Services {
    /// A start-up that failed half-way stops what it had started.
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The common service: one named thread running a body until its stop signal turns true.
pub(crate) struct Thread {
    name: String,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl Thread {
    /// Starts `body` on a thread named `name`; it is to return once the receiver it is
    /// given turns true.
    pub(crate) fn spawn(
        name: &str,
        body: impl FnOnce(watch::Receiver<bool>) + Send + 'static,
    ) -> io::Result<Self> {
        let (stop, stopped) = watch::channel(false);
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || body(stopped))?;
        Ok(Self {
            name: name.to_owned(),
            stop,
            handle,
        })
    }
}

impl Service for Thread {
    fn name(&self) -> &str {
        &self.name
    }

    fn stop(&mut self) {
        let _ = self.stop.send(true);
    }

    fn join(self: Box<Self>) {
        if self.handle.join().is_err() {
            tracing::error!("{} panicked", self.name);
        }
    }
}

/// The crypto threads of the `threads` backend or of dedicated crypto_mb batches.
pub(crate) struct CryptoThreads(pub(crate) std::sync::Arc<terminus_engine::ThreadPool>);

impl Service for CryptoThreads {
    fn name(&self) -> &str {
        "crypto threads"
    }

    /// Not yet: the workers, stopped after them and draining, still queue operations.
    fn stop(&mut self) {}

    fn join(self: Box<Self>) {
        // Joined after the workers (started before them): what they queued before they
        // stopped is computed, then the threads end.
        self.0.stop();
    }
}

/// What is left of the process once every service has stopped: its threads besides the
/// caller's and those that live as long as the process (the error log's writer), and its network sockets (TCP and UDP: listeners, clients, upstreams, the
/// fleet's store; not tokio's signal pipe, which lives as long as the process). Both are
/// none after a clean shutdown; anything else is a service that did not stop.
pub(crate) fn leftovers() -> (Vec<String>, usize) {
    let own = terminus_sys::current_tid().map_or_else(|_| String::new(), |t| t.to_string());
    let threads = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|task| task.file_name().to_str() != Some(own.as_str()))
        .map(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .map_or_else(|_| "?".to_owned(), |name| name.trim().to_owned())
        })
        .filter(|name| !crate::logs::PROCESS_THREADS.contains(&name.as_str()))
        .collect();
    // A network socket's inode is in one of these tables; a Unix socket's is not.
    let network: std::collections::HashSet<String> = ["tcp", "tcp6", "udp", "udp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/self/net/{t}")).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(9).map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .collect();
    let sockets = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(network.contains(inode))
        })
        .filter(|&is_network| is_network)
        .count();
    (threads, sockets)
}
