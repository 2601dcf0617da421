//! `terminus load`: the command line of the load generator in `terminus-load`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use terminus_load::{LoadOptions, Mode, TlsChoice, Trust};

#[derive(Args)]
#[command(group(clap::ArgGroup::new("loop").required(true).args(["rate", "connections"])))]
pub struct LoadArgs {
    /// https:// URL to load, e.g. https://localhost:8443/ (or http:// for a plain-HTTP
    /// baseline, such as the server behind a TLS-terminating proxy)
    #[arg(value_name = "URL")]
    url: String,
    /// Open loop: send this many requests per second on a fixed schedule; latency is
    /// measured from each request's scheduled send time.
    #[arg(long, value_name = "R")]
    rate: Option<f64>,
    /// Closed loop: this many connections, each sending its next request as soon as the
    /// previous response is in.
    #[arg(long, short = 'c', value_name = "C")]
    connections: Option<usize>,
    /// How long to send, e.g. 10s, 2m.
    #[arg(long, short = 'd', value_name = "D", value_parser = parse_duration)]
    duration: Duration,
    /// Load threads (each its own event loop).
    #[arg(long, short = 't', value_name = "T", default_value_t = 1)]
    threads: usize,
    /// Pin thread i to the i-th CPU of this list (e.g. 1, 0,2, 2-3).
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    pin: Option<CpuList>,
    /// A new TCP connection and TLS handshake for every request (wrk's
    /// `Connection: close` case).
    #[arg(long)]
    new_connection: bool,
    /// Resume TLS sessions (tickets) on new connections instead of full handshakes.
    #[arg(long)]
    resume: bool,
    /// With --connections: one request on each connection, then all stay open and idle
    /// for the duration (from when the last one is open: stderr says `idle: N
    /// connections open`), then one more request each, reported as `after_idle`.
    #[arg(long)]
    idle: bool,
    /// TLS version: 1.2 or 1.3 (default: both offered).
    #[arg(long, value_name = "V")]
    tls: Option<String>,
    /// Cipher suite(s) to offer, rustls names, comma-separated
    /// (e.g. TLS13_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256).
    #[arg(long, value_name = "SUITES", value_delimiter = ',')]
    cipher: Vec<String>,
    /// Key-exchange group(s) to offer, in order: x25519mlkem768 (post-quantum hybrid,
    /// TLS 1.3), x25519, secp256r1, secp384r1. Default: the three classical ones, so that
    /// comparisons with servers without ML-KEM are like for like.
    #[arg(long, value_name = "GROUPS", value_delimiter = ',')]
    group: Vec<String>,
    /// Signature algorithm(s) to offer (e.g. rsa_pss_rsae_sha256, ecdsa_secp256r1_sha256):
    /// picks the server's RSA or ECDSA certificate.
    #[arg(long, value_name = "ALGS", value_delimiter = ',')]
    sigalg: Vec<String>,
    /// Verify the server against the CA certificates in this PEM file (default: the
    /// system's CA bundle).
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    cacert: Option<PathBuf>,
    /// Do not verify the server's certificate chain or name (the handshake signature is
    /// still checked). For benchmarks against test servers only.
    #[arg(long, short = 'k')]
    insecure: bool,
    /// Speak HTTP/2 (ALPN h2); one request at a time per connection.
    #[arg(long, conflicts_with = "http3")]
    http2: bool,
    /// Speak HTTP/3 over QUIC (ALPN h3, UDP to the URL's port); one request at a time
    /// per connection. The report has no connect phase: QUIC's handshake is its connect.
    #[arg(long)]
    http3: bool,
    /// Compute the client's key exchanges in terminus's crypto engine, batched 8 per
    /// crypto_mb call where the CPU has AVX-512 IFMA (scalar otherwise). For measuring
    /// capacity: a request may wait for its batch, and that wait counts in the handshake
    /// latency.
    #[arg(long)]
    batch_kx: bool,
    /// Simulate a network round trip of D: each flight the client sends in answer to the
    /// server (a TLS 1.2 key exchange, the Finished, every request) leaves D after what it
    /// answers arrived, so the server has handshakes waiting on their clients as on a real
    /// network. Handshake times and closed-loop request times leave these waits out; open-loop
    /// request times, counted from the schedule, include them.
    #[arg(long, value_name = "D", default_value = "0s", value_parser = parse_duration)]
    rtt: Duration,
    /// Open loop: the most connections open at once; further requests wait for one,
    /// their latency clock running.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    max_connections: usize,
    /// Each request's connect, handshake and response must finish within this.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// Allow a target that is not a loopback address. Only load servers you are
    /// responsible for.
    #[arg(long)]
    allow_remote: bool,
    /// Connect to IP instead of resolving the URL's host, which still names the server
    /// (SNI, Host): to load a virtual host without a DNS entry, as curl's --resolve.
    /// Repeat it to spread new connections over several servers in turn (a fleet behind
    /// a round-robin balancer).
    #[arg(long, value_name = "IP")]
    address: Vec<std::net::IpAddr>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    terminus_server::parse_duration(text)
        .ok_or_else(|| format!("{text:?} is not a duration (e.g. 500ms, 10s, 2m)"))
}

/// One `--pin` value. A named type, because clap's derive reads a field typed
/// `Option<Vec<_>>` as "the flag may repeat" and then cannot hand it a whole list.
type CpuList = Vec<usize>;

fn parse_cpus(text: &str) -> Result<CpuList, String> {
    terminus_load::parse_cpu_list(text)
        .ok_or_else(|| format!("{text:?} is not a CPU list (e.g. 1, 0,2, 2-3)"))
}

pub fn run(args: LoadArgs) -> ExitCode {
    let mode = match (args.rate, args.connections) {
        (Some(r), _) => Mode::Rate(r),
        (None, Some(c)) => Mode::Connections(c),
        (None, None) => unreachable!("clap requires --rate or --connections"),
    };
    let trust = match (args.insecure, args.cacert) {
        (true, _) => Trust::Insecure,
        (false, Some(path)) => Trust::CaFile(path),
        (false, None) => Trust::System,
    };
    let options = LoadOptions {
        url: args.url,
        mode,
        duration: args.duration,
        threads: args.threads,
        pin: args.pin.unwrap_or_default(),
        new_connection: args.new_connection,
        tls: TlsChoice {
            versions: args.tls.into_iter().collect(),
            ciphers: args.cipher,
            groups: args.group,
            sigalgs: args.sigalg,
            trust,
            resume: args.resume,
            http: match (args.http2, args.http3) {
                (_, true) => terminus_load::Http::H3,
                (true, _) => terminus_load::Http::H2,
                _ => terminus_load::Http::H1,
            },
            batch_kx: args.batch_kx,
        },
        max_connections: args.max_connections,
        rtt: args.rtt,
        timeout: args.timeout,
        allow_remote: args.allow_remote,
        address: args.address,
        progress: !args.json,
        idle: args.idle,
    };
    match terminus_load::run(&options) {
        Ok(report) => {
            if args.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.text());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("terminus load: error: {e}");
            ExitCode::from(2)
        }
    }
}
