//! The open-file cache: what it serves while an entry is valid, what a revalidation
//! notices (a changed file, a deleted one, a symlink swapped to leave the root), its
//! bounds on open descriptors, and `cache = false`.

use std::os::unix::fs::symlink;
use std::time::Duration;

use crate::harness::*;

/// One worker (one cache) serving `dir/www` with `[files]` set to `files`.
fn start(dir: &TestDir, files: &str) -> Server {
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let config = Config::new(dir, &pair)
        .workers(1)
        .before(&format!("[files]\n{files}"));
    ServerBuilder::with(dir, &config).start()
}

fn etag_and_body(server: &Server, path: &str) -> (u16, Option<String>, Vec<u8>) {
    let (code, head, body) = headers(server, &["--http1.1"], path);
    (code, header_value(&head, "etag"), body)
}

/// Regular files under `under` that `server` holds open.
fn open_files(server: &Server, under: &std::path::Path) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", server.child.id()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(under) && target.is_file())
        .count()
}

#[test]
fn an_entry_is_served_until_revalidated_then_changes_and_deletions_show() {
    // Small and large files: in memory and by descriptor.
    for (name, size) in [("small.txt", 100), ("large.bin", 100_000)] {
        let dir = TestDir::new("cache-change");
        dir.write(&format!("www/{name}"), vec![b'a'; size]);
        let path = format!("/{name}");
        // Valid for an hour: a change on disk is not seen, which proves the cache serves.
        let long = start(&dir, "cache_valid = \"1h\"");
        let (_, first, body) = etag_and_body(&long, &path);
        assert_eq!(body.len(), size);
        // A different size and content: a new ETag whatever the clock's resolution.
        dir.write(&format!("www/{name}"), vec![b'b'; size + 1]);
        let (_, still, _) = etag_and_body(&long, &path);
        assert_eq!(still, first, "{name}: served from the cache while valid");
        drop(long);

        // Valid for 200 ms: the change shows within that (waited for, not slept).
        let short = start(&dir, "cache_valid = \"200ms\"");
        let (_, before, _) = etag_and_body(&short, &path);
        dir.write(&format!("www/{name}"), vec![b'c'; size + 2]);
        eventually(Duration::from_secs(10), "the new ETag", || {
            let (_, now, body) = etag_and_body(&short, &path);
            now != before && body == vec![b'c'; size + 2]
        });
        std::fs::remove_file(dir.path(&format!("www/{name}"))).unwrap();
        eventually(Duration::from_secs(10), "404 for the deleted file", || {
            etag_and_body(&short, &path).0 == 404
        });
        // Errors are cached too, and revalidated the same way.
        dir.write(&format!("www/{name}"), "back\n");
        eventually(Duration::from_secs(10), "the file served again", || {
            etag_and_body(&short, &path).2 == b"back\n"
        });
    }
}

#[test]
fn a_symlink_swapped_to_leave_the_root_is_refused_once_revalidated() {
    let dir = TestDir::new("cache-symlink");
    dir.write("www/inside.txt", "inside\n");
    dir.write("secret.txt", "TOP SECRET\n");
    symlink("inside.txt", dir.path("www/link.txt")).unwrap();
    let server = start(&dir, "cache_valid = \"200ms\"\ncache_max_size = 0");
    assert_eq!(etag_and_body(&server, "/link.txt").2, b"inside\n");
    let swapped = dir.path("www/link.tmp");
    symlink(dir.path("secret.txt"), &swapped).unwrap();
    std::fs::rename(&swapped, dir.path("www/link.txt")).unwrap();
    eventually(Duration::from_secs(10), "403 for the swapped link", || {
        let (code, _, body) = etag_and_body(&server, "/link.txt");
        assert!(!String::from_utf8_lossy(&body).contains("SECRET"), "leaked");
        code == 403
    });
}

#[test]
fn descriptors_stay_within_the_bound() {
    let dir = TestDir::new("cache-bound");
    for i in 0..20 {
        dir.write(&format!("www/f{i}.bin"), vec![b'x'; 20_000]);
    }
    let www = dir.path("www");
    // Files above cache_max_size are held open; four entries at most.
    let server = start(&dir, "cache_entries = 4");
    for i in 0..20 {
        assert_eq!(etag_and_body(&server, &format!("/f{i}.bin")).0, 200);
        let held = open_files(&server, &www);
        assert!(held <= 4, "{held} files open after {} requests", i + 1);
    }
    assert!(
        open_files(&server, &www) >= 1,
        "the cache holds no descriptor"
    );
    drop(server);

    // Small files live in memory: no descriptor held.
    let server = start(&dir, "cache_max_size = 65536");
    for i in 0..20 {
        assert_eq!(
            etag_and_body(&server, &format!("/f{i}.bin")).2.len(),
            20_000
        );
    }
    assert_eq!(open_files(&server, &www), 0);
}

#[test]
fn cache_off_sees_every_change_and_holds_nothing() {
    let dir = TestDir::new("cache-off");
    dir.write("www/a.bin", vec![b'a'; 100_000]);
    let server = start(&dir, "cache = false");
    let (_, first, _) = etag_and_body(&server, "/a.bin");
    dir.write("www/a.bin", vec![b'b'; 100_001]);
    let (_, second, body) = etag_and_body(&server, "/a.bin");
    assert_ne!(first, second);
    assert_eq!(body, vec![b'b'; 100_001]);
    assert_eq!(open_files(&server, &dir.path("www")), 0);
    std::fs::remove_file(dir.path("www/a.bin")).unwrap();
    assert_eq!(etag_and_body(&server, "/a.bin").0, 404);
}

#[test]
fn bad_cache_settings_name_the_line() {
    let dir = TestDir::new("cache-config");
    let pair = make_cert(&dir.0, "k", KeyKind::EcdsaP256, &["localhost"]);
    let conf = Config::new(&dir, &pair)
        .before("[files]\ncache_valid = \"soon\"\n")
        .write(&dir);
    let out = run(std::process::Command::new(terminus_bin())
        .args(["check", "--config"])
        .arg(&conf));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("terminus.toml:5") && err.contains("\"soon\" is not a duration"),
        "{err}"
    );
}
