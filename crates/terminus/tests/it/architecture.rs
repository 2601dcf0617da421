//! docs/ARCHITECTURE.md's map of the crates against the tree: every crate it names
//! exists and every crate is named; every folder and file it lists under a crate exists;
//! every top module of a crate (a file or folder in its `src/`) is named in its crate's
//! entry as a list item; every path the page quotes exists; and the dependency chains it
//! draws (`a -> b -> c`) are the crates' own: each depends on the next, none on one
//! before it. A module added, moved or removed without the map, or a dependency that
//! points up, fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn page() -> String {
    std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md")
}

/// The map's code block: the lines between the fences after "## The crates".
fn map(page: &str) -> Vec<&str> {
    let after = &page[page.find("## The crates").expect("a crates section")..];
    let mut lines = after.lines().skip_while(|l| !l.starts_with("```")).skip(1);
    lines
        .by_ref()
        .take_while(|l| !l.starts_with("```"))
        .collect()
}

/// Each crate's entry in the map (`crates/NAME` at the line's start), with the lines
/// that continue it and its indented sub-entries; and the sub-entries' paths.
fn entries(map: &[&str]) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in map {
        if !line.starts_with(' ') {
            let head = line.split_whitespace().next().unwrap_or("");
            current = head
                .strip_prefix("crates/")
                .map(|name| name.trim_end_matches('/').to_owned())
                .filter(|name| !name.contains('/'));
            if let Some(name) = &current {
                out.entry(name.clone()).or_default();
            }
        }
        let Some(name) = &current else { continue };
        let entry = out.get_mut(name).expect("entry made above");
        entry.0.push_str(line);
        entry.0.push('\n');
        // A sub-entry: two spaces, then a path.
        if line.starts_with("  ") && !line.starts_with("   ") {
            entry
                .1
                .push(line.split_whitespace().next().unwrap_or("").to_owned());
        }
    }
    out
}

/// The top modules of `krate`: its `src/`'s files and folders, less lib.rs and main.rs.
fn top_modules(krate: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(krate.join("src"))
        .expect("a crate's src")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|x| x == "rs"))
        .map(|p| {
            p.file_stem()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n != "lib" && n != "main")
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether `text` names `module` as an item of a list: no letter, digit or underscore
/// before it, and after it what follows an item (` (`, `,`, `;`, `:`, `)`, `/`, `.rs`,
/// the line's end), not a word of prose (`the capacity of`).
fn names(text: &str, module: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(module).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + module.len()..];
        !before.is_some_and(is_word)
            && [" (", ",", ";", ":", ")", "/", ".rs", "\n"]
                .iter()
                .any(|end| after.starts_with(end))
    })
}

/// Whether a path the page quotes is in the tree: from the root, under `crates/`, in the
/// `src/` of the crate it starts with, or in some crate (its `src/` or itself).
fn exists(quoted: &str) -> bool {
    let root = root();
    if root.join(quoted).exists() || root.join("crates").join(quoted).exists() {
        return true;
    }
    // `config/upstream/`: a crate, then a path in its `src/`.
    if let Some((krate, rest)) = quoted.split_once('/') {
        if root
            .join("crates")
            .join(krate)
            .join("src")
            .join(rest)
            .exists()
        {
            return true;
        }
    }
    std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("a directory entry").path())
        .any(|krate| krate.join("src").join(quoted).exists() || krate.join(quoted).exists())
}

/// Every workspace crate's directory, by package name.
fn packages() -> BTreeMap<String, String> {
    std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .map(|e| e.expect("a directory entry").path())
        .filter_map(|dir| {
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
            let name = manifest
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))?
                .trim_end_matches('"')
                .to_owned();
            let dir = dir.file_name()?.to_string_lossy().into_owned();
            Some((name, dir))
        })
        .collect()
}

/// The workspace crates (by directory) `krate` lists under `[dependencies]`.
fn dependencies(krate: &str, packages: &BTreeMap<String, String>) -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml"))
        .expect("a manifest");
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[dependencies]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| {
            let key = l.split(['=', '.']).next()?.trim();
            packages.get(key).cloned()
        })
        .collect()
}

#[test]
fn the_architecture_map_names_every_crate_and_top_module_and_nothing_else() {
    let page = page();
    let map = map(&page);
    let entries = entries(&map);
    let mut wrong = Vec::new();

    // Every entry at a line's start is a path in the tree.
    for line in &map {
        if line.starts_with(' ') || line.trim().is_empty() {
            continue;
        }
        let path = line.split_whitespace().next().unwrap_or("");
        if !root().join(path).exists() {
            wrong.push(format!("the map lists {path}, which does not exist"));
        }
    }

    let crates: Vec<String> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.join("Cargo.toml").exists())
        .map(|p| {
            p.file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for krate in &crates {
        let Some((text, subs)) = entries.get(krate) else {
            wrong.push(format!("crates/{krate} is not in the map"));
            continue;
        };
        let dir = root().join("crates").join(krate);
        for sub in subs {
            if !dir.join(sub).exists() && !dir.join("src").join(sub).exists() {
                wrong.push(format!(
                    "the map lists {sub} under crates/{krate}, which has none"
                ));
            }
        }
        for module in top_modules(&dir) {
            if !names(text, &module) {
                wrong.push(format!(
                    "crates/{krate}'s module {module} is not in its entry"
                ));
            }
        }
    }

    // Every path quoted anywhere on the page: a folder or a file of ours. (The fences'
    // lines go first: their three backticks would pair the rest the wrong way.)
    let prose: String = page
        .lines()
        .filter(|l| !l.trim_start().starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n");
    let quotes: Vec<&str> = prose.split('`').skip(1).step_by(2).collect();
    let files = [".rs", "/", ".py", ".md", ".toml"];
    for quoted in &quotes {
        let path = !quoted.contains(char::is_whitespace)
            && quoted.contains('/')
            && files.iter().any(|end| quoted.ends_with(end));
        if path && !exists(quoted) {
            wrong.push(format!("the page quotes {quoted}, which does not exist"));
        }
    }

    // The dependency chains the page draws.
    let packages = packages();
    let crate_name = |c: &str| {
        !c.is_empty()
            && c.chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
    };
    let chains: Vec<Vec<String>> = quotes
        .iter()
        .filter(|q| q.contains(" -> "))
        .map(|q| {
            q.split("->")
                .map(|c| c.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|chain| chain.iter().all(|c| crate_name(c)))
        .collect();
    assert!(!chains.is_empty(), "the page draws no dependency chain");
    for chain in &chains {
        for (i, krate) in chain.iter().enumerate() {
            if !root().join("crates").join(krate).exists() {
                wrong.push(format!("the chain {chain:?} names {krate}, no crate"));
                continue;
            }
            let deps = dependencies(krate, &packages);
            if let Some(next) = chain.get(i + 1) {
                if !deps.contains(next) {
                    wrong.push(format!(
                        "{krate} does not depend on {next}, as {chain:?} says"
                    ));
                }
            }
            for above in &chain[..i] {
                if deps.contains(above) {
                    wrong.push(format!(
                        "{krate} depends on {above}, up the chain {chain:?}"
                    ));
                }
            }
        }
    }

    assert!(
        wrong.is_empty(),
        "docs/ARCHITECTURE.md and the tree disagree:\n{}",
        wrong.join("\n")
    );
}
