//! `terminus speed`: a row of positive figures per operation asked for, and clear errors.

use std::process::Command;

use crate::harness::terminus_bin;

fn speed(args: &[&str]) -> std::process::Output {
    Command::new(terminus_bin())
        .arg("speed")
        .args(args)
        .output()
        .expect("run terminus speed")
}

#[test]
fn prints_ops_per_second_and_crossover_for_each_operation() {
    let out = speed(&[
        "x25519mlkem768",
        "x25519",
        "ecdsap256",
        "ecdhp384",
        "--seconds",
        "0.2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The multibuffer columns are there exactly where crypto_mb runs: both ways asserted,
    // so a machine that should batch and does not fails here instead of skipping.
    let batched = terminus_engine::multibuffer::applicable();
    assert_eq!(
        !text.contains("multibuffer: not available"),
        batched,
        "multibuffer figures iff crypto_mb runs here:\n{text}"
    );
    for op in ["x25519mlkem768", "x25519", "ecdsap256", "ecdhp384"] {
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(op))
            .unwrap_or_else(|| panic!("no {op} row:\n{text}"))
            .split_whitespace()
            .collect();
        // op, description words..., scalar/s, multibuffer/s, speedup, crossover
        let n = row.len();
        let scalar: f64 = row[n - 4].parse().unwrap();
        assert!(scalar > 0.0, "{op}: {row:?}");
        if batched {
            let mb: f64 = row[n - 3].parse().unwrap();
            assert!(mb > 0.0, "{op}: {row:?}");
            let crossover = row[n - 1];
            // The hybrid's batches are decided by its X25519 half.
            let own = op != "x25519mlkem768";
            assert!(
                if own {
                    crossover == "never" || (1..=8).contains(&crossover.parse::<u32>().unwrap())
                } else {
                    crossover == "=x25519"
                },
                "{op}: {row:?}"
            );
        }
    }
    assert!(
        !text.contains("rsa2048"),
        "only what was asked for:\n{text}"
    );
}

#[test]
fn multi_runs_several_threads() {
    let out = speed(&["ecdsap256", "--seconds", "0.2", "--multi", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2 threads at once"), "{text}");
}

#[test]
fn unknown_operation_and_bad_duration_are_refused() {
    let out = speed(&["rsa1024"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown operation \"rsa1024\"") && err.contains("rsa2048"),
        "{err}"
    );
    let out = speed(&["x25519", "--seconds", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seconds"));
}
