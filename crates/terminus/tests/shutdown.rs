//! Shutdown as one lifecycle: every service terminus starts is stopped and waited for.

mod common;

use std::time::Duration;

use common::*;
use terminus_testkit::Redis;

/// SIGTERM stops every service terminus started (the workers, the `threads` backend's
/// crypto threads, the admin listener, the health checks with an upstream to check,
/// memory housekeeping, the ACME manager retrying a CA that does not answer, and the
/// fleet's store rounds connected to Redis) and the process says, after they have all
/// been joined and before it exits, that no thread and no network socket is left: not a
/// thread detached, not the store's connection.
#[test]
fn sigterm_stops_every_service_and_leaves_no_thread_or_connection() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let dir = TestDir::new("stop-all");
    let key_file = dir.write("fleet.key", format!("{}\n", "ab".repeat(32)));
    let unanswered = free_port();
    let conf = dir.write(
        "terminus.toml",
        format!(
            "listen = [\"127.0.0.1:0\"]\nworkers = 2\n\
             [crypto]\nbackend = \"threads\"\nthreads = 2\n\
             [fleet]\nstore = \"{}\"\nkey_file = \"{}\"\npoll = \"200ms\"\n\
             [acme]\ndirectory = \"https://127.0.0.1:{unanswered}/dir\"\nstate_dir = \"{}\"\n\
             [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:{unanswered}\"]\n\
             health = {{ path = \"/healthz\", interval = \"100ms\" }}\n\
             [[server]]\nnames = [\"localhost\"]\ndefault = true\n\
             [[server.route]]\npath = \"/\"\nupstream = \"app\"\n\
             [[server]]\nnames = [\"acme.test\"]\ncertificates = \"acme\"\n",
            redis.url(),
            key_file.display(),
            dir.path("acme").display(),
        ),
    );
    let mut server = Server::start_with(
        &["--config", conf.to_str().unwrap(), "--admin", "127.0.0.1:0"],
        false,
    );
    eventually(Duration::from_secs(10), "the fleet on its store", || {
        server.metric("terminus_fleet_store_up", &[]) == 1.0
    });
    let clients = || redis.cli(&["CLIENT", "LIST"]).lines().count();
    assert!(clients() >= 2, "terminus holds no connection to the store");
    // The ACME manager is running: it has tried the CA that does not answer.
    eventually(Duration::from_secs(10), "the ACME manager at work", || {
        server.stderr().contains("acme: no account at")
    });
    server.signal("TERM");
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    let log = server.stderr();
    assert!(
        log.contains("terminus stopped: every service joined, no thread or socket left"),
        "a service did not stop:\n{log}"
    );
    assert_eq!(clients(), 1, "the store still has terminus's connection");
}
