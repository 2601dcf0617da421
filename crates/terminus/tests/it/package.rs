//! The Debian package, as contrib/debian/build-deb makes it from this build's binary and
//! as dpkg reads it: its control fields, conffiles and maintainer scripts; every path
//! with its mode, all of them root's; the repository's files copied as they are; its
//! md5sums. Unpacked (`dpkg-deb -x`) into a throwaway root that also holds what its
//! dependencies and postinst make (ssl-cert's snakeoil pair, /var/log/terminus), its
//! configuration, each absolute path taken inside that root, passes the unpacked
//! binary's `terminus check` and serves (on a loopback port of the test's instead of
//! 443); its unit passes `systemd-analyze verify --root` there, and fails it once the
//! binary is gone, and `systemd-analyze security` rates its exposure at most 1.5. And
//! contrib/logrotate/terminus as logrotate reads it, with its
//! postrotate's guard. Installing with dpkg or apt and starting the service need a booted
//! systemd and a base system, which a test machine need not have: not done here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use terminus_testkit::{eventually, runs_here, Need};

use crate::harness::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn repo_file(path: &str) -> Vec<u8> {
    std::fs::read(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn answers(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// dpkg-deb and dpkg-shlibdeps are here; otherwise the skip is shown and counted.
fn dpkg_dev_here() -> bool {
    runs_here(
        Need::DpkgDev,
        answers("dpkg-deb") && answers("dpkg-shlibdeps"),
        "dpkg-deb or dpkg-shlibdeps (dpkg-dev) is not installed",
    )
}

/// `out` succeeded; else the test fails with what `what` printed.
fn succeeded(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = run(Command::new("dpkg-deb").args(args).arg(deb));
    succeeded(&format!("dpkg-deb {args:?}"), &out)
}

/// The package, built once per test process (into `CARGO_TARGET_TMPDIR`, where the
/// folders of earlier processes are removed).
fn deb() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("deb-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let out = tmp.join(format!("deb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let built = run(Command::new(repo().join("contrib/debian/build-deb"))
            .args(["--binary", terminus_bin(), "--out"])
            .arg(&out));
        let stdout = succeeded("contrib/debian/build-deb", &built);
        let path = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
        let version = env!("CARGO_PKG_VERSION");
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        assert!(
            name.starts_with(&format!("terminus_{version}-1_")) && name.ends_with(".deb"),
            "{path:?}"
        );
        assert!(path.is_file(), "{path:?}");
        path
    })
}

/// A control file's fields (continuation lines joined to their field by newlines).
fn control_fields(text: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in text.lines() {
        if line.starts_with(' ') {
            if let Some(field) = last.as_ref().and_then(|l| fields.get_mut(l)) {
                let value: &mut String = field;
                value.push('\n');
                value.push_str(line);
            }
        } else if let Some((name, value)) = line.split_once(':') {
            fields.insert(name.to_owned(), value.trim().to_owned());
            last = Some(name.to_owned());
        }
    }
    fields
}

/// `tar -tv`'s listing (as `dpkg-deb --contents` prints it): each path's mode and owner.
fn listing(text: &str) -> BTreeMap<String, (String, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert!(words.len() == 6, "a listing's line: {line}");
            (
                words[5].to_owned(),
                (words[0].to_owned(), words[1].to_owned()),
            )
        })
        .collect()
}

const DIR: &str = "drwxr-xr-x";
const FILE: &str = "-rw-r--r--";
const EXECUTABLE: &str = "-rwxr-xr-x";

/// Every path the package holds, with its mode.
const CONTENTS: &[(&str, &str)] = &[
    ("./", DIR),
    ("./etc/", DIR),
    ("./etc/logrotate.d/", DIR),
    ("./etc/logrotate.d/terminus", FILE),
    ("./etc/terminus/", DIR),
    ("./etc/terminus/terminus.toml", FILE),
    ("./lib/", DIR),
    ("./lib/systemd/", DIR),
    ("./lib/systemd/system/", DIR),
    ("./lib/systemd/system/terminus.service", FILE),
    ("./usr/", DIR),
    ("./usr/bin/", DIR),
    ("./usr/bin/terminus", EXECUTABLE),
    ("./usr/lib/", DIR),
    ("./usr/lib/modules-load.d/", DIR),
    ("./usr/lib/modules-load.d/terminus.conf", FILE),
    ("./usr/share/", DIR),
    ("./usr/share/doc/", DIR),
    ("./usr/share/doc/terminus/", DIR),
    ("./usr/share/doc/terminus/README.md", FILE),
    ("./usr/share/doc/terminus/changelog.Debian.gz", FILE),
    ("./usr/share/doc/terminus/copyright", FILE),
    ("./usr/share/doc/terminus/examples/", DIR),
    (
        "./usr/share/doc/terminus/examples/terminus.example.toml",
        FILE,
    ),
];

/// The control archive's members, with their modes.
const CONTROL: &[(&str, &str)] = &[
    ("./", DIR),
    ("./conffiles", FILE),
    ("./control", FILE),
    ("./md5sums", FILE),
    ("./postinst", EXECUTABLE),
    ("./postrm", EXECUTABLE),
    ("./prerm", EXECUTABLE),
];

const CONFFILES: &[&str] = &["/etc/terminus/terminus.toml", "/etc/logrotate.d/terminus"];

/// `deb` unpacked into `dir/root`, its control archive into `dir/DEBIAN`.
fn unpack(dir: &TestDir, deb: &Path) -> (PathBuf, PathBuf) {
    let root = dir.path("root");
    let control = dir.path("DEBIAN");
    let out = run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root));
    succeeded("dpkg-deb -x", &out);
    let out = run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control));
    succeeded("dpkg-deb -e", &out);
    (root, control)
}

fn assert_listing(what: &str, got: &BTreeMap<String, (String, String)>, want: &[(&str, &str)]) {
    let want: BTreeMap<String, (String, String)> = want
        .iter()
        .map(|(path, mode)| {
            (
                (*path).to_owned(),
                ((*mode).to_owned(), "root/root".to_owned()),
            )
        })
        .collect();
    let mut wrong = Vec::new();
    for (path, (mode, owner)) in &want {
        match got.get(path) {
            None => wrong.push(format!("{path} is missing")),
            Some(had) if had != &(mode.clone(), owner.clone()) => {
                wrong.push(format!("{path} is {had:?}, not {mode} {owner}"))
            }
            Some(_) => {}
        }
    }
    for path in got.keys().filter(|p| !want.contains_key(*p)) {
        wrong.push(format!("{path} is not expected"));
    }
    assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
}

#[test]
fn the_deb_holds_binary_unit_config_and_logrotate_as_debian_has_them_and_its_config_serves() {
    if !dpkg_dev_here() {
        return;
    }
    let deb = deb();
    let version = format!("{}-1", env!("CARGO_PKG_VERSION"));

    // The control fields.
    let fields = control_fields(&dpkg_deb(&["--field"], deb));
    let field = |name: &str| {
        fields
            .get(name)
            .unwrap_or_else(|| panic!("no {name} field: {fields:?}"))
            .as_str()
    };
    assert_eq!(field("Package"), "terminus");
    assert_eq!(field("Version"), version);
    let arch = succeeded(
        "dpkg --print-architecture",
        &run(Command::new("dpkg").arg("--print-architecture")),
    );
    assert_eq!(field("Architecture"), arch.trim());
    assert_eq!(field("Section"), "httpd");
    assert_eq!(field("Priority"), "optional");
    assert!(
        field("Maintainer").contains('<') && field("Maintainer").ends_with('>'),
        "{fields:?}"
    );
    let depends: Vec<&str> = field("Depends").split(',').map(str::trim).collect();
    // adduser for the postinst, ssl-cert for the configuration's certificate, and what
    // dpkg-shlibdeps found the binary links: glibc, and OpenSSL's libcrypto (crypto_mb's
    // BIGNUM entry points, README's crypto_mb section).
    for want in ["adduser", "ssl-cert", "libc6 (>= ", "libssl3"] {
        assert!(
            depends.iter().any(|d| d.starts_with(want)),
            "Depends lacks {want}: {depends:?}"
        );
    }
    assert!(
        field("Description").contains("\n .\n"),
        "a synopsis and a long description: {fields:?}"
    );

    // The conffiles, the control archive's and the data's paths, modes and owners.
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(deb)
        .arg("conffiles"));
    let conffiles = succeeded("dpkg-deb --info conffiles", &conffiles);
    assert_eq!(conffiles.lines().collect::<Vec<_>>(), CONFFILES);
    let control = run(Command::new("sh")
        .args(["-c", "dpkg-deb --ctrl-tarfile \"$0\" | tar -tvf -"])
        .arg(deb));
    assert_listing(
        "the control archive",
        &listing(&succeeded("the control archive's listing", &control)),
        CONTROL,
    );
    let contents = listing(&dpkg_deb(&["--contents"], deb));
    assert_listing("the package's files", &contents, CONTENTS);

    let dir = TestDir::new("package");
    let (root, control) = unpack(&dir, deb);
    let installed = |path: &str| {
        std::fs::read(root.join(path)).unwrap_or_else(|e| panic!("{path} in the package: {e}"))
    };

    // The repository's files, as they are.
    for (installed_as, source) in [
        (
            "lib/systemd/system/terminus.service",
            "contrib/systemd/terminus.service",
        ),
        ("etc/terminus/terminus.toml", "contrib/debian/terminus.toml"),
        ("etc/logrotate.d/terminus", "contrib/logrotate/terminus"),
        (
            "usr/lib/modules-load.d/terminus.conf",
            "contrib/debian/modules-load.conf",
        ),
        ("usr/share/doc/terminus/README.md", "README.md"),
        (
            "usr/share/doc/terminus/examples/terminus.example.toml",
            "terminus.example.toml",
        ),
    ] {
        assert!(
            installed(installed_as) == repo_file(source),
            "/{installed_as} is not {source}"
        );
    }
    let changelog = run(Command::new("gzip")
        .arg("-dc")
        .arg(root.join("usr/share/doc/terminus/changelog.Debian.gz")));
    let changelog = succeeded("gzip -dc changelog.Debian.gz", &changelog);
    assert!(
        changelog.starts_with(&format!("terminus ({version}) ")),
        "{changelog}"
    );
    let copyright = String::from_utf8(installed("usr/share/doc/terminus/copyright")).unwrap();
    assert!(
        copyright.starts_with(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
        ) && copyright.contains("License: Apache-2.0"),
        "{copyright}"
    );

    // The binary: this build's, stripped of its symbols but not of its USDT probes.
    let binary = root.join("usr/bin/terminus");
    let said = succeeded(
        "the packaged terminus --version",
        &run(Command::new(&binary).arg("--version")),
    );
    assert_eq!(
        said.trim(),
        format!("terminus {}", env!("CARGO_PKG_VERSION"))
    );
    let sections = succeeded(
        "readelf -S",
        &run(Command::new("readelf").arg("-SW").arg(&binary)),
    );
    assert!(!sections.contains(" .symtab "), "not stripped:\n{sections}");
    assert!(
        sections.contains(" .note.stapsdt "),
        "the USDT probes' notes are gone:\n{sections}"
    );

    // md5sums: every file but the conffiles, each as unpacked.
    let md5sums = std::fs::read_to_string(control.join("md5sums")).unwrap();
    let summed: BTreeSet<String> = md5sums
        .lines()
        .map(|l| l.split_once("  ").expect("HASH  PATH").1.to_owned())
        .collect();
    let files: BTreeSet<String> = CONTENTS
        .iter()
        .filter(|(path, _)| !path.ends_with('/'))
        .map(|(path, _)| path.trim_start_matches("./").to_owned())
        .filter(|path| !CONFFILES.contains(&format!("/{path}").as_str()))
        .collect();
    assert_eq!(summed, files);
    let checked = run(Command::new("md5sum")
        .args(["-c", "--quiet"])
        .arg(control.join("md5sums"))
        .current_dir(&root));
    succeeded("md5sum -c DEBIAN/md5sums", &checked);

    // The maintainer scripts: valid sh, and doing what Debian's packages do.
    for (script, says) in [
        (
            "postinst",
            &[
                "adduser --system --group --home /var/lib/terminus --no-create-home --quiet terminus",
                "if [ -z \"$2\" ]; then\n\t\tadduser --quiet terminus ssl-cert >/dev/null\n\tfi",
                "chown terminus:adm /var/log/terminus",
                "chmod 2750 /var/log/terminus",
                "dpkg-statoverride --list /var/log/terminus",
                "deb-systemd-helper enable 'terminus.service'",
                "deb-systemd-invoke start 'terminus.service'",
                "/usr/bin/terminus upgrade --config /etc/terminus/terminus.toml || handover=$?",
                "if [ \"$handover\" = 3 ]; then\n\t\t\t\tdeb-systemd-invoke restart",
                "deb-systemd-invoke restart 'terminus.service'",
                "[ -d /run/systemd/system ]",
            ][..],
        ),
        ("prerm", &["deb-systemd-invoke stop 'terminus.service'"][..]),
        (
            "postrm",
            &[
                "rm -rf /var/log/terminus /var/lib/terminus",
                "deb-systemd-helper purge 'terminus.service'",
            ][..],
        ),
    ] {
        let path = control.join(script);
        succeeded(
            &format!("sh -n {script}"),
            &run(Command::new("sh").arg("-n").arg(&path)),
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("#!/bin/sh\n"), "{script}:\n{text}");
        for line in says {
            assert!(text.contains(line), "{script} lacks {line}:\n{text}");
        }
    }

    // The configuration in the unpacked root, with what the package's dependencies and
    // postinst would have made there: ssl-cert's snakeoil pair (an RSA-2048 certificate
    // for the host's name, made as make-ssl-cert makes it) and the logs' folder.
    let config = String::from_utf8(installed("etc/terminus/terminus.toml")).unwrap();
    for named in [
        "listen = [\"0.0.0.0:443\", \"[::]:443\"]",
        "access = \"/var/log/terminus/access.log\"",
        "cert = \"/etc/ssl/certs/ssl-cert-snakeoil.pem\"",
        "key = \"/etc/ssl/private/ssl-cert-snakeoil.key\"",
    ] {
        assert!(config.contains(named), "the configuration lacks {named}");
    }
    let cert = root.join("etc/ssl/certs/ssl-cert-snakeoil.pem");
    let key = root.join("etc/ssl/private/ssl-cert-snakeoil.key");
    std::fs::create_dir_all(cert.parent().unwrap()).unwrap();
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::fs::create_dir_all(root.join("var/log/terminus")).unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-days",
        "3650",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=DNS:localhost",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        cert.to_str().unwrap(),
    ]);
    // Every absolute path taken inside the root, as a chroot would.
    let rooted = dir.write(
        "rooted.toml",
        config.replace("\"/", &format!("\"{}/", root.display())),
    );
    let checked = run(Command::new(&binary)
        .args(["check", "--config"])
        .arg(&rooted));
    let said = succeeded("the packaged terminus check", &checked);
    assert!(
        said.contains("ok (1 server(s), 1 certificate(s))"),
        "{said}"
    );

    // It serves: the built-in page, with the snakeoil certificate, each request logged.
    let server = ServerBuilder::config(&rooted)
        .args(&["--listen", "127.0.0.1:0"])
        .start();
    assert_eq!(status(&server, &[], "/"), 200);
    assert_eq!(served_fingerprint(&server, &[]), fingerprint(&cert));
    let log = root.join("var/log/terminus/access.log");
    eventually(Duration::from_secs(10), "a line in the access log", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("\"GET / HTTP/"))
    });
}

/// The packaged unit in the unpacked root, with the host's units beside it (what
/// `systemd-analyze verify --root` needs to build the start job: sysinit.target, the
/// network targets): it verifies, its commands found in the root. The same check fails
/// once the root's binary is gone, so it is not vacuous.
#[test]
fn the_packaged_unit_verifies_in_the_unpacked_root() {
    if !dpkg_dev_here()
        || !runs_here(
            Need::SystemdAnalyze,
            answers("systemd-analyze"),
            "systemd-analyze is not installed",
        )
    {
        return;
    }
    let dir = TestDir::new("package-unit");
    let (root, _) = unpack(&dir, deb());
    let units = root.join("lib/systemd/system");
    // -n: the package's own unit stays.
    let copied = run(Command::new("cp")
        .arg("-an")
        .arg("/lib/systemd/system/.")
        .arg(&units));
    succeeded("cp -an /lib/systemd/system/.", &copied);
    let unit = units.join("terminus.service");
    let verify = || {
        run(Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.display()))
            .arg(&unit))
    };
    let out = verify();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");

    std::fs::remove_file(root.join("usr/bin/terminus")).unwrap();
    let out = verify();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("/usr/bin/terminus"),
        "verify passed without the binary in the root: {said}"
    );
}

/// The most `systemd-analyze security` may rate the packaged unit's exposure (systemd
/// 252's scale: 0 safest, 10 unrestricted; 1.5 is what the unit affords a daemon that
/// binds ports: the system-call filter keeps @resources for CPU pinning and the
/// descriptor limit, and the address families, capability and network are what it
/// serves with). The unit before issue 66 rated 3.7.
const EXPOSURE_AT_MOST: f64 = 1.5;

/// The packaged unit in the unpacked root, as `systemd-analyze security --offline`
/// rates it: its overall exposure is at most [`EXPOSURE_AT_MOST`].
#[test]
fn the_packaged_unit_rates_at_most_1_5_in_systemd_analyze_security() {
    if !dpkg_dev_here()
        || !runs_here(
            Need::SystemdAnalyze,
            answers("systemd-analyze"),
            "systemd-analyze is not installed",
        )
    {
        return;
    }
    let dir = TestDir::new("package-security");
    let (root, _) = unpack(&dir, deb());
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(format!("--root={}", root.display()))
        .arg("terminus.service"));
    let said = succeeded("systemd-analyze security", &out);
    // "→ Overall exposure level for terminus.service: 1.5 OK 🙂"
    let exposure: f64 = said
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for terminus.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in:\n{said}"));
    println!("systemd-analyze security: exposure {exposure}");
    assert!(
        exposure <= EXPOSURE_AT_MOST,
        "the unit's exposure is {exposure}, over {EXPOSURE_AT_MOST}; what it lacks:\n{}",
        said.lines()
            .filter(|l| l.starts_with('✗'))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// contrib/logrotate/terminus, its log folder and user moved to the test's: logrotate
/// reads it without an error and, forced (`--debug`: nothing done), would rotate the
/// access log, make the new one 0640 and run the postrotate script once. That script,
/// with a stand-in systemctl: SIGUSR1 to the main process while the service is active,
/// nothing (and success) while it is not.
#[test]
fn logrotate_reads_the_packaged_rotation_and_its_postrotate_signals_only_a_running_service() {
    let available = answers("logrotate");
    if !runs_here(Need::Logrotate, available, "logrotate is not installed") {
        return;
    }
    let dir = TestDir::new("logrotate");
    let text = String::from_utf8(repo_file("contrib/logrotate/terminus")).unwrap();
    assert!(text.contains("/var/log/terminus/*.log {"), "{text}");
    assert!(text.contains("\tcreate 0640 terminus adm\n"), "{text}");
    assert!(text.contains("\tsu terminus adm\n"), "{text}");
    let id = |flag: &str| {
        let out = run(Command::new("id").arg(flag));
        succeeded("id", &out).trim().to_owned()
    };
    let (user, group) = (id("-un"), id("-gn"));
    let logs = dir.path("log");
    let moved = text
        .replace("/var/log/terminus/", &format!("{}/", logs.display()))
        .replace(" terminus adm\n", &format!(" {user} {group}\n"));
    dir.write("log/access.log", "a line\n");
    let config = dir.write("terminus.logrotate", moved);
    let out = run(Command::new("logrotate")
        .args(["--debug", "--force", "--state"])
        .arg(dir.path("state"))
        .arg(&config));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    // logrotate reports a bad line as an error and goes on, exiting 0.
    assert!(
        !said.lines().any(|l| l.starts_with("error:")),
        "logrotate found errors:\n{said}"
    );
    let access = logs.join("access.log");
    for step in [
        format!("rotating pattern: {}/*.log", logs.display()),
        format!("considering log {}", access.display()),
        format!("renaming {} to {}.1", access.display(), access.display()),
        format!("creating new {} mode = 0640", access.display()),
        "running postrotate script".to_owned(),
    ] {
        assert!(
            said.contains(&step),
            "logrotate would not do {step}:\n{said}"
        );
    }

    // The postrotate script, with a systemctl that answers is-active as told and records
    // the rest.
    let script = text
        .split_once("\tpostrotate\n")
        .and_then(|(_, rest)| rest.split_once("\tendscript"))
        .map(|(script, _)| script.to_owned())
        .expect("a postrotate script");
    let bin = dir.path("bin");
    let calls = dir.path("calls");
    let systemctl = dir.write(
        "bin/systemctl",
        format!(
            "#!/bin/sh\nif [ \"$1\" = --quiet ] && [ \"$2\" = is-active ]; then exit \"$ACTIVE\"; fi\necho \"$*\" >>{}\n",
            calls.display()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (active, signalled) in [("3", false), ("0", true)] {
        let _ = std::fs::remove_file(&calls);
        let out = run(Command::new("sh")
            .args(["-c", &script])
            .env("PATH", &path)
            .env("ACTIVE", active));
        succeeded(
            &format!("the postrotate script (is-active: {active})"),
            &out,
        );
        let called = std::fs::read_to_string(&calls).unwrap_or_default();
        if signalled {
            assert_eq!(
                called,
                "kill --kill-whom=main --signal=USR1 terminus.service\n"
            );
        } else {
            assert_eq!(called, "", "a stopped service was signalled");
        }
    }
}
