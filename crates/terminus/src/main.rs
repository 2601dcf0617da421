//! The `terminus` command: `serve`, `check`, `upgrade`, `speed`, `load`, `capacity`
//! and `top`.

mod admin;
mod capacity;
mod load;
mod speed;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use terminus_server::{Overrides, ServerOptions};

#[derive(Parser)]
#[command(
    name = "terminus",
    version,
    about = "TLS-terminating HTTPS server whose handshake crypto runs through an asynchronous, batching crypto engine",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve HTTPS. Without --config: 127.0.0.1:8443, self-signed RSA-2048 and ECDSA P-256
    /// certificates for `localhost` made at start, and a built-in page at `/`.
    Serve(ServeArgs),
    /// Validate a config file (syntax, certificates, keys, docroots) and exit:
    /// 0 when it is usable, 1 with file, line and a hint when not.
    Check {
        /// The config file to check.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
    },
    /// Measure handshake crypto on this CPU, like `openssl speed`: ops/s per operation
    /// scalar (aws-lc) and in full 8-lane batches (crypto_mb), and the crossover batch
    /// size from which batching pays.
    Speed {
        /// Operations to measure (default: all): rsa2048 rsa3072 rsa4096 ecdsap256
        /// ecdsap384 x25519 ecdhp256 ecdhp384 x25519mlkem768.
        #[arg(value_name = "OP")]
        ops: Vec<String>,
        /// Seconds per measurement.
        #[arg(long, value_name = "S", default_value_t = 3.0)]
        seconds: f64,
        /// Run on N threads at once (N cores) and report the total.
        #[arg(long, value_name = "N", default_value_t = 1)]
        multi: usize,
        /// Measure instead what crypto_mb batches cost scalar code afterwards, on this
        /// core and a neighbour (AVX-512 frequency licences), and what crypto.simd =
        /// "auto" would choose (default ops: rsa2048 ecdsap256).
        #[arg(long, conflicts_with_all = ["seconds", "multi"])]
        frequency: bool,
    },
    /// Measure this machine's crypto capacity in appliance units: ACU (RSA-2048
    /// private-key operations per second) per core and for the machine with a backend,
    /// the ACU cost of every handshake operation one by one and batched, and SCU (Mbps of
    /// record encryption) per cipher.
    Capacity {
        /// auto, scalar or multibuffer (as crypto.backend).
        #[arg(long, value_name = "NAME", default_value = "auto")]
        backend: String,
        /// Seconds per measurement.
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        seconds: f64,
        /// Instead of measuring, print a running terminus's capacity table: total,
        /// allocated, used and free ACU, per tenant (its admin listener, IP:PORT).
        #[arg(long, value_name = "ADDR")]
        admin: Option<String>,
    },
    /// Load an HTTPS server and report connect, handshake and request latency
    /// (p50/p90/p99/p99.9/max), achieved rate and errors by kind. Open loop with --rate
    /// (latency from each request's scheduled time, as wrk2), closed loop with
    /// --connections (as wrk). Loopback targets only, unless --allow-remote.
    Load(load::LoadArgs),
    /// Hand the running terminus over to a new process without refusing a connection:
    /// the binary at the path it was started from (the new one, after a package
    /// upgrade) starts with its arguments, takes every listening socket over, and
    /// serves; the old process then drains (upgrade.drain) and exits. What only a new
    /// process can change (workers, listeners, [admin], [signer], ...) changes so too.
    /// Exits 0 once the new process serves; 1, the old one serving on, when it cannot;
    /// 3 when no terminus answers on the control socket.
    Upgrade {
        /// The config file whose upgrade.socket names the control socket.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: Option<PathBuf>,
        /// The control socket (instead of the config's upgrade.socket; default
        /// /run/terminus/control.sock).
        #[arg(long, value_name = "PATH", conflicts_with = "config")]
        socket: Option<PathBuf>,
        /// Print the running process's PID and generation, and upgrade nothing.
        #[arg(long)]
        status: bool,
    },
    /// A live view of a running terminus through its admin listener, refreshed every
    /// interval: handshakes/s full and resumed, each handshake phase's p50/p99, crypto
    /// batch fill per operation, queue depth, errors by cause, per worker. Plain text
    /// when stdout is not a terminal.
    Top {
        /// The admin listener, IP:PORT.
        #[arg(long, value_name = "ADDR")]
        admin: String,
        /// Seconds between refreshes (each view shows what changed over one).
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        interval: f64,
        /// Print one view and exit.
        #[arg(long)]
        once: bool,
        /// JSON, one object per view (with --once: one object).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file (see README.md). Flags below override it.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on, IP:PORT; repeatable. Replaces the file's `listen`.
    #[arg(long, value_name = "ADDR")]
    listen: Vec<String>,
    /// Certificate chain (PEM, leaf first) for the default server; repeatable, each
    /// paired with the --key at the same position. Give an RSA and an ECDSA pair to
    /// serve both.
    #[arg(long, value_name = "PEM")]
    cert: Vec<PathBuf>,
    /// Unencrypted private key (PEM: PKCS#8, PKCS#1 or SEC1) for the --cert at the same position.
    #[arg(long, value_name = "PEM")]
    key: Vec<PathBuf>,
    /// Serve static files from this directory on the default server.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Number of worker threads (default: one per core).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Pin worker i to CPU i.
    #[arg(long)]
    pin: bool,
    /// Crypto engine backend: auto (multibuffer where the CPU has AVX-512 IFMA, else
    /// scalar), multibuffer (crypto_mb batches), scalar (on the worker) or threads
    /// (offload pool).
    #[arg(long, value_name = "NAME")]
    crypto_backend: Option<String>,
    /// Turn off session resumption (tickets and cache): every handshake is a full one.
    #[arg(long)]
    no_resumption: bool,
    /// The admin listener, over plain HTTP on this address: the status page (GET / in a
    /// browser, /status.json), /metrics (Prometheus), /capacity and /healthz.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Kernel TLS after the handshake for every listener: auto (where the kernel has
    /// it, else userspace TLS), off, or required (refuse connections it cannot take).
    #[arg(long, value_name = "MODE")]
    ktls: Option<String>,
}

/// Logs at `level`, unless RUST_LOG says otherwise, to standard error or to the error
/// log file `log.error` names (written by a thread of its own, reopened on SIGUSR1).
/// Colour only on a terminal (and not under `NO_COLOR`): escapes would litter a log file
/// or the journal.
fn init_logging(level: &str, file: Option<&std::path::Path>) -> Result<(), String> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match file {
        None => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder
                .with_ansi(colour)
                .with_writer(std::io::stderr)
                .init();
        }
        Some(path) => {
            let log = terminus_server::logs::ErrorLog::open(path)
                .map_err(|e| format!("log.error {}: {e}", path.display()))?;
            // The log lives as long as the process: its handle is leaked to the
            // subscriber, which is global.
            let log: &'static terminus_server::logs::ErrorLog = Box::leak(Box::new(log));
            builder
                .with_ansi(false)
                .with_writer(move || log.line())
                .init();
        }
    }
    Ok(())
}

/// `terminus upgrade`.
fn upgrade(config: Option<PathBuf>, socket: Option<PathBuf>, status: bool) -> ExitCode {
    use terminus_server::upgrade_client::{ask, socket_of, Answer, Unanswered};
    let socket = match socket {
        Some(socket) => socket,
        None => {
            let options = ServerOptions {
                config_path: config,
                overrides: Overrides::default(),
            };
            match socket_of(&options) {
                Ok(socket) => socket,
                Err(e) => {
                    eprintln!("terminus: error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let command = if status { "status" } else { "upgrade" };
    match ask(&socket, command, &mut |line| eprintln!("terminus: {line}")) {
        Ok(Answer::Serving { pid, generation }) if status => {
            println!("serving: pid {pid}, generation {generation}");
            ExitCode::SUCCESS
        }
        Ok(Answer::Serving { pid, generation }) => {
            println!("upgraded: pid {pid} (generation {generation}) serves; the old process drains and exits");
            ExitCode::SUCCESS
        }
        Ok(Answer::Refused(why)) => {
            eprintln!("terminus: upgrade refused: {why}");
            ExitCode::FAILURE
        }
        Err(e @ Unanswered::Unreachable(_)) => {
            eprintln!("terminus: error: {e}");
            ExitCode::from(UNREACHABLE)
        }
        Err(e) => {
            eprintln!("terminus: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `terminus upgrade`'s exit status when no terminus answers on the control socket (1:
/// one answered and the upgrade failed, the running process serving on): the package's
/// postinst restarts the service then, and only then.
const UNREACHABLE: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            if args.cert.len() != args.key.len() {
                eprintln!(
                    "terminus: error: {} --cert but {} --key; give them in pairs (--cert a.pem --key a.key)",
                    args.cert.len(),
                    args.key.len()
                );
                return ExitCode::from(2);
            }
            let options = ServerOptions {
                config_path: args.config,
                overrides: Overrides {
                    listen: args.listen,
                    certs: args.cert.into_iter().zip(args.key).collect(),
                    root: args.root,
                    workers: args.workers,
                    pin: args.pin,
                    crypto_backend: args.crypto_backend,
                    no_resumption: args.no_resumption,
                    admin: args.admin,
                    ktls: args.ktls,
                },
            };
            // A config that does not load is reported by `run` itself.
            let (level, error_log) = options.log_settings();
            if let Err(e) = init_logging(&level.as_str().to_ascii_lowercase(), error_log.as_deref())
            {
                eprintln!("terminus: error: {e}");
                return ExitCode::FAILURE;
            }
            let ran = terminus_server::run(options);
            // What the error log holds is written before the process ends.
            terminus_server::logs::close_error();
            match ran {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("terminus: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { config } => {
            let _ = init_logging("warn", None);
            let options = ServerOptions {
                config_path: Some(config.clone()),
                overrides: Overrides::default(),
            };
            match terminus_server::check(&options) {
                Ok(terminus_server::Checked {
                    site,
                    warnings,
                    found,
                }) => {
                    for w in &warnings {
                        eprintln!("terminus: warning: {w}");
                    }
                    for f in &found {
                        println!("{f}");
                    }
                    println!(
                        "{}: ok ({} server(s), {} certificate(s))",
                        config.display(),
                        site.hosts.len(),
                        site.certificates.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("terminus: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Speed {
            ops,
            seconds,
            multi,
            frequency,
        } => match speed::run(speed::SpeedArgs {
            ops,
            seconds,
            multi,
            frequency,
        }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("terminus: error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Capacity {
            backend,
            seconds,
            admin,
        } => {
            let done = match admin {
                Some(addr) => capacity::show(&addr).map_err(Into::into),
                None => capacity::run(capacity::CapacityArgs { backend, seconds }),
            };
            match done {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("terminus: error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Load(args) => load::run(args),
        Command::Upgrade {
            config,
            socket,
            status,
        } => upgrade(config, socket, status),
        Command::Top {
            admin,
            interval,
            once,
            json,
        } => {
            if !(interval.is_finite() && interval > 0.0) {
                eprintln!(
                    "terminus: error: --interval {interval}: give a number of seconds above 0"
                );
                return ExitCode::from(2);
            }
            match top::run(top::TopArgs {
                admin,
                interval: std::time::Duration::from_secs_f64(interval),
                once,
                json,
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("terminus: error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
