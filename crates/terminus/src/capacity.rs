//! `terminus capacity`: this machine's crypto capacity in ACU and SCU with a backend, and
//! the ACU cost of every handshake operation (see `terminus_capacity`); with
//! `--admin`, a running server's table of tenants from its `GET /capacity`.

use std::error::Error;
use std::io::Write;
use std::time::Duration;

use serde_json::Value;

use terminus_capacity::simd::after_effect::{self, Settings};
use terminus_capacity::simd::placement::NOISE_FLOOR;
use terminus_capacity::{scu_per_core, Capacity, CIPHERS};
use terminus_engine::cost::{Operation, Workload};
use terminus_engine::{multibuffer, BackendKind};

use crate::admin::AdminError;

pub struct CapacityArgs {
    pub backend: String,
    pub seconds: f64,
}

/// Measures and prints the table; Err names what was wrong with the input.
pub fn run(args: CapacityArgs) -> Result<(), Box<dyn Error>> {
    let backend = match args.backend.as_str() {
        "auto" => BackendKind::auto(),
        "scalar" => BackendKind::Scalar,
        "multibuffer" if multibuffer::applicable() => BackendKind::Multibuffer,
        "multibuffer" => {
            return Err("--backend multibuffer: this CPU has no AVX-512 IFMA".into());
        }
        other => {
            return Err(format!("--backend {other:?}: give auto, scalar or multibuffer").into())
        }
    };
    if !(args.seconds > 0.0 && args.seconds <= 60.0) {
        return Err(format!(
            "--seconds {} is out of range; give 0 < S <= 60",
            args.seconds
        )
        .into());
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "terminus capacity: backend {}, one core measured, {} s per measurement; the machine is {cores} cores of it",
        backend.name(),
        args.seconds
    );
    let capacity = Capacity::measure(backend, &Operation::ALL, duration)?;
    let acu = capacity.acu_per_core();
    println!(
        "ACU (RSA-2048 private-key operations/s): {acu:.0} per core, {:.0} for the machine",
        acu * cores as f64
    );
    if backend == BackendKind::Multibuffer {
        after_effect(acu)?;
    }
    println!(
        "{:<14} {:<26} {:>12} {:>12} {:>10} {:>10}",
        "op", "one operation is", "scalar/s", "batched/s", "ACU alone", "ACU batched"
    );
    for rate in &capacity.rates {
        let batched = rate
            .batched_per_s
            .map_or("n/a".to_owned(), |b| format!("{b:.0}"));
        let cost = |batched| {
            capacity
                .acu_cost(rate, batched)
                .map_or("n/a".to_owned(), |c| format!("{c:.3}"))
        };
        println!(
            "{:<14} {:<26} {:>12.0} {:>12} {:>10} {:>10}",
            rate.op.name(),
            rate.op.describe(),
            rate.scalar_per_s,
            batched,
            cost(false),
            cost(true)
        );
        let _ = std::io::stdout().flush();
    }
    println!("SCU (Mbps of 16 KiB records sealed):");
    println!("{:<18} {:>12} {:>14}", "cipher", "per core", "machine");
    for (name, cipher) in CIPHERS {
        let scu = scu_per_core(cipher, duration);
        println!("{name:<18} {scu:>12.0} {:>14.0}", scu * cores as f64);
    }
    println!("An operation's ACU is the share of a core's second it takes over an RSA-2048 operation's with this backend: \"alone\" computed one by one, \"batched\" in full 8-lane calls. The machine's figures assume its cores scale alike.");
    Ok(())
}

/// The after-effect of RSA-2048 batches on the first CPU this process may use (as the
/// server measures it at start-up), and `acu` per core with it counted: a worker core's
/// scalar work right after batches runs at the measured share of its speed.
fn after_effect(acu: f64) -> Result<(), Box<dyn Error>> {
    let cpu = terminus_sys::allowed_cpus()
        .map_err(|e| format!("sched_getaffinity: {e}"))?
        .first()
        .copied()
        .unwrap_or(0);
    let workload = Workload::generate(Operation::Rsa2048)?;
    let effect = after_effect::measure_on(cpu, &workload, &Settings::default())?;
    let ratio = effect.same_core;
    println!(
        "after-effect of RSA-2048 batches on CPU {cpu}: scalar code right after them runs at {ratio} of its speed; ACU per core with it counted: {:.0} ({})",
        acu * ratio.median.min(1.0),
        if ratio.loss() <= NOISE_FLOOR {
            "within the noise floor: crypto.simd = \"auto\" keeps batches inline"
        } else {
            "see terminus speed --frequency for what crypto.simd = \"auto\" chooses"
        }
    );
    Ok(())
}

/// Prints the capacity table of the terminus whose admin listener is `addr`.
pub fn show(addr: &str) -> Result<(), AdminError> {
    let doc = crate::admin::get_json(addr, "/capacity")?;
    let num = |v: &Value| v.as_f64().map_or("-".to_owned(), |n| format!("{n:.0}"));
    let acu = &doc["acu"];
    println!(
        "terminus at {addr}: backend {}, {} workers, crypto_mb batches {}{}",
        doc["backend"].as_str().unwrap_or("?"),
        doc["workers"],
        doc["simd"]["placement"].as_str().unwrap_or("?"),
        match doc["simd"]["crypto_cpus"].as_array() {
            Some(cpus) if !cpus.is_empty() => format!(" on CPUs {}", Value::Array(cpus.clone())),
            _ => String::new(),
        }
    );
    println!(
        "ACU/s  total {}  allocated {}  free {}  used {}  ({} per core)",
        num(&acu["total"]),
        num(&acu["allocated"]),
        num(&acu["free"]),
        num(&acu["used_per_s"]),
        num(&acu["per_core"])
    );
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>9} {:>8} {:>8}",
        "tenant",
        "acu",
        "peak",
        "used/s",
        "free/s",
        "committed",
        "borrowed",
        "refused",
        "waiting",
        "over"
    );
    for t in doc["tenants"].as_array().into_iter().flatten() {
        let q = &t["quota"];
        let refused: u64 = t["handshakes_refused"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        println!(
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>9} {:>8} {:>8}",
            t["name"].as_str().unwrap_or("?"),
            num(&q["acu"]),
            num(&q["acu_peak"]),
            num(&t["used_acu_per_s"]),
            num(&t["free_acu_per_s"]),
            num(&t["acu_total"]["committed"]),
            num(&t["acu_total"]["borrowed"]),
            refused,
            t["waiting"],
            q["over_quota"].as_str().unwrap_or("-")
        );
    }
    println!("committed and borrowed: ACU used since start; refused: handshakes refused by the quota since start.");
    let fleet = &doc["fleet"];
    if let Some(tenants) = fleet["tenants"].as_object() {
        println!(
            "fleet: {} instances share the quotas (this instance's share, then each instance's)",
            fleet["instances"]
        );
        println!(
            "{:<20} {:<18} {:>8} {:>12} {:>10}",
            "tenant", "instance", "share", "demand/s", "used/s"
        );
        for (name, t) in tenants {
            for i in t["instances"].as_array().into_iter().flatten() {
                println!(
                    "{:<20} {:<18} {:>8.3} {:>12} {:>10}",
                    name,
                    i["id"].as_str().unwrap_or("?"),
                    i["share"].as_f64().unwrap_or(0.0),
                    num(&i["demand_acu_per_s"]),
                    num(&i["used_acu_per_s"])
                );
            }
        }
    }
    Ok(())
}
