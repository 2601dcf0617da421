//! Obtains crypto_mb as the pinned PyPI wheels `ipp-crypto-static` and
//! `ipp-crypto-include` (pip download, sha256 checked, unpacked with Python's zipfile)
//! and links `libcrypto_mb.a` statically. `CRYPTO_MB_DIR` may name an unpacked copy
//! (`lib/libcrypto_mb.a`, `include/crypto_mb/*.h`) for offline builds.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

const VERSION: &str = "2026.2.0";
/// (package, wheel file, sha256), as pinned in DESIGN.md.
const WHEELS: [(&str, &str, &str); 2] = [
    (
        "ipp-crypto-static",
        "ipp_crypto_static-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
        "b4b952a9435f7aab3d1684822f644d586ce5f6bda874e4bfb8c008ee674ca5c5",
    ),
    (
        "ipp-crypto-include",
        "ipp_crypto_include-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
        "356e825406c834e31d6490c659494760707064b7bf0fe957fc100e72f0497c51",
    ),
];

fn main() {
    println!("cargo:rerun-if-env-changed=CRYPTO_MB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let root = match env::var_os("CRYPTO_MB_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => fetch(&PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"))),
    };
    let lib = root.join("lib");
    if !lib.join("libcrypto_mb.a").is_file() {
        panic!(
            "crypto-mb-sys: {} has no lib/libcrypto_mb.a (CRYPTO_MB_DIR must point at an unpacked ipp-crypto-static/-include {VERSION})",
            root.display()
        );
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=static=crypto_mb");
    // The archive's objects also hold crypto_mb's OpenSSL-BIGNUM entry points (the
    // `_ssl_` functions we do not call); they reference libcrypto, so link the system's.
    println!("cargo:rustc-link-lib=dylib:+verbatim=libcrypto.so.3");
    println!("cargo:include={}", root.join("include").display());
    // For this crate's ABI test, which compiles the headers against our declarations.
    println!(
        "cargo:rustc-env=CRYPTO_MB_INCLUDE_DIR={}",
        root.join("include").display()
    );
}

fn sha256_hex(path: &Path) -> Option<String> {
    let bytes = fs::read(path).ok()?;
    Some(
        Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("crypto-mb-sys: cannot run {what}: {e}"));
    if !status.success() {
        panic!("crypto-mb-sys: {what} failed ({status}); set CRYPTO_MB_DIR to an unpacked copy to build offline");
    }
}

/// Downloads, verifies and unpacks the wheels under `out`; returns the unpacked root.
fn fetch(out: &Path) -> PathBuf {
    let root = out.join(format!("crypto_mb-{VERSION}"));
    let wheels = out.join("wheels");
    fs::create_dir_all(&wheels).expect("create wheels dir");
    let unpacked = out.join("unpacked");
    for (package, file, sha256) in WHEELS {
        let wheel = wheels.join(file);
        if sha256_hex(&wheel).as_deref() != Some(sha256) {
            let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
            run(
                Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--only-binary=:all:",
                        "--quiet",
                        "-d",
                    ])
                    .arg(&wheels)
                    .arg(format!("{package}=={VERSION}")),
                &format!("pip download {package}=={VERSION}"),
            );
        }
        match sha256_hex(&wheel) {
            Some(h) if h == sha256 => {}
            got => panic!(
                "crypto-mb-sys: {file} has sha256 {got:?}, expected {sha256}: refusing to link it"
            ),
        }
        run(
            Command::new(env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
                .args([
                    "-c",
                    "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])",
                ])
                .arg(&wheel)
                .arg(&unpacked),
            &format!("unpacking {file}"),
        );
    }
    let data = unpacked.join(format!("ipp_crypto_static-{VERSION}.data/data/lib"));
    let headers = unpacked.join(format!(
        "ipp_crypto_include-{VERSION}.data/data/include/aggregator/crypto_mb"
    ));
    fs::create_dir_all(root.join("lib")).expect("create lib dir");
    fs::create_dir_all(root.join("include/crypto_mb")).expect("create include dir");
    fs::copy(data.join("libcrypto_mb.a"), root.join("lib/libcrypto_mb.a"))
        .expect("copy libcrypto_mb.a");
    for entry in fs::read_dir(&headers).expect("headers in the include wheel") {
        let entry = entry.expect("header entry");
        fs::copy(
            entry.path(),
            root.join("include/crypto_mb").join(entry.file_name()),
        )
        .expect("copy header");
    }
    root
}
