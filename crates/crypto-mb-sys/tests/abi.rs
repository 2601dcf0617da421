//! Our FFI declarations against crypto_mb's own headers: every `extern "C"` function in
//! `src/lib.rs` is turned into the C function-pointer type it claims to be, and a C
//! compiler checks, with the headers included, that the library's prototype is that type
//! (`__builtin_types_compatible_p`), that the status constants and the per-lane status
//! macro agree with ours, and that the integer types have the sizes we give them. A
//! pointer level, a `const`, an argument or a constant that drifts from the header fails
//! here on any CPU, before anything calls it.

use std::path::Path;
use std::process::Command;

const HEADERS: &[&str] = &[
    "crypto_mb/defs.h",
    "crypto_mb/status.h",
    "crypto_mb/cpu_features.h",
    "crypto_mb/rsa.h",
    "crypto_mb/x25519.h",
    "crypto_mb/ec_nistp256.h",
    "crypto_mb/ec_nistp384.h",
];

/// The C spelling of one of our Rust parameter or return types.
fn c_type(rust: &str) -> String {
    let t = rust.trim();
    if let Some(inner) = t.strip_prefix("*const ") {
        return format!("{} const*", c_type(inner));
    }
    if let Some(inner) = t.strip_prefix("*mut ") {
        return format!("{}*", c_type(inner));
    }
    match t {
        "c_int" => "int".into(),
        "int8u" | "int64u" | "mbx_status" | "mbx_RSA_Method" => t.into(),
        other => panic!("no C spelling for the Rust type {other:?}: extend c_type"),
    }
}

/// (name, C function-pointer type) of every foreign function declared in `source`.
fn declarations(source: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("pub fn ") {
        rest = &rest[at + "pub fn ".len()..];
        let open = rest.find('(').expect("(");
        let name = rest[..open].trim().to_owned();
        let close = open + rest[open..].find(')').expect(")");
        let params = &rest[open + 1..close];
        let after = rest[close + 1..].trim_start();
        let (ret, end) = match after.strip_prefix("->") {
            Some(r) => {
                let end = r.find([';', '{']).expect("end of signature");
                (r[..end].trim(), r.as_bytes()[end])
            }
            None => ("()", after.as_bytes()[0]),
        };
        if end != b';' {
            continue; // a Rust function with a body, not a foreign declaration
        }
        let args: Vec<String> = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| c_type(p.split_once(':').expect("name: type").1))
            .collect();
        let ret = if ret == "()" {
            "void".into()
        } else {
            c_type(ret)
        };
        out.push((name, format!("{ret} (*)({})", args.join(", "))));
    }
    out
}

#[test]
fn declarations_match_crypto_mb_headers() {
    let source = include_str!("../src/lib.rs");
    let decls = declarations(source);
    assert!(decls.len() >= 14, "found only {decls:?}");
    let mut c = String::from("#include <stdio.h>\n");
    for h in HEADERS {
        c += &format!("#include <{h}>\n");
    }
    c += "#define SAME(name, type) _Static_assert(__builtin_types_compatible_p(__typeof__(&name), type), #name \": src/lib.rs does not match the header\")\n";
    for (name, ty) in &decls {
        c += &format!("SAME({name}, {ty});\n");
    }
    for (name, value) in [
        ("MBX_STATUS_OK", crypto_mb_sys::MBX_STATUS_OK),
        (
            "MBX_STATUS_MISMATCH_PARAM_ERR",
            crypto_mb_sys::MBX_STATUS_MISMATCH_PARAM_ERR,
        ),
        (
            "MBX_STATUS_NULL_PARAM_ERR",
            crypto_mb_sys::MBX_STATUS_NULL_PARAM_ERR,
        ),
        (
            "MBX_STATUS_LOW_ORDER_ERR",
            crypto_mb_sys::MBX_STATUS_LOW_ORDER_ERR,
        ),
        (
            "MBX_STATUS_SIGNATURE_ERR",
            crypto_mb_sys::MBX_STATUS_SIGNATURE_ERR,
        ),
    ] {
        c += &format!("_Static_assert({name} == {value}, \"{name}\");\n");
    }
    // MBX_GET_STS is an inline function: its agreement with lane_status is checked when
    // the program runs.
    c += "int main(void) {\n    int bad = 0;\n";
    for status in [0x8765_4321u32, 0x0000_00f0, 0xa000_0001] {
        for lane in 0..crypto_mb_sys::LANES {
            let ours = crypto_mb_sys::lane_status(status, lane);
            c += &format!(
                "    if (MBX_GET_STS({status:#x}u, {lane}) != {ours}u) {{ printf(\"lane_status({status:#x}, {lane}) != MBX_GET_STS\\n\"); bad = 1; }}\n"
            );
        }
    }
    c += "    return bad;\n}\n";
    c += "_Static_assert(sizeof(int8u) == 1 && (int8u)-1 > 0, \"int8u is u8\");\n";
    c += "_Static_assert(sizeof(int64u) == 8 && (int64u)-1 > 0, \"int64u is u64\");\n";
    c += "_Static_assert(sizeof(mbx_status) == 4 && (mbx_status)-1 > 0, \"mbx_status is u32\");\n";

    let dir = std::env::temp_dir().join(format!("crypto-mb-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("abi.c");
    std::fs::write(&file, &c).unwrap();
    let include = env!("CRYPTO_MB_INCLUDE_DIR");
    assert!(Path::new(include).join(HEADERS[0]).is_file(), "{include}");
    let exe = dir.join("abi");
    let compiled = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Werror", "-I", include])
        .arg(&file)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) to check the headers");
    assert!(
        compiled.status.success(),
        "{}\n--- generated check ---\n{c}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let ran = Command::new(&exe).output().expect("run the check");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stdout)
    );
}

#[test]
fn c_types_are_spelled_from_the_inside_out() {
    assert_eq!(c_type("*const *mut int8u"), "int8u* const*");
    assert_eq!(c_type("*const mbx_RSA_Method"), "mbx_RSA_Method const*");
    assert_eq!(c_type("c_int"), "int");
}
