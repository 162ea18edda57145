//! The architecture, checked: the library's modules depend on one another one way only, from
//! the command line down to the vocabulary (see `LEVELS`); no two files of a directory use
//! each other; clap stays in the command line; the plan, predictor and simulator keep their
//! functions short enough to read.
//!
//! Every `use crate::…`, `crate::…` path and `super::…` path of `src/` is read (use trees with
//! braces expanded), and in `src/cli` and `src/main.rs` every `stepcast::…` path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's layers, bottom first: a module may use modules of its own layer (without
/// cycles) and of the layers below, never above.
const LEVELS: &[&[&str]] = &[
    // vocabulary and utilities
    &[
        "named",
        "limits",
        "timing",
        "rng",
        "stats",
        "error",
        "fsutil",
        "ops",
        "assets",
        "provenance",
        "progress",
    ],
    &["hardware"],
    &["workload", "dataset", "analytic", "fault"],
    &["plan", "regress", "schedule", "export"],
    &["memory"],
    &["predict"],
    &["search", "calibrate"],
    &["cli"],
];

/// Longest function allowed in these directories, in lines.
const LONGEST_FUNCTION: usize = 120;
const SHORT_FUNCTION_DIRS: &[&str] = &["src/plan", "src/predict", "src/schedule"];

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file: `src/plan/layer.rs` → ["plan", "layer"], `src/plan/mod.rs` →
/// ["plan"], `src/lib.rs` → [].
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Source without comments and string literals (so paths in docs and messages do not count).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if text[i..].starts_with("//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            i += text[i..].find("*/").map_or(bytes.len() - i, |e| e + 2);
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if text[i..].starts_with("'\"'") {
            i += 3;
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap().trim();
        return vec![path.trim_end_matches("::self").to_string()];
    };
    let prefix = tree[..open].trim().trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| {
            if p == "self" {
                prefix.to_string()
            } else {
                format!("{prefix}::{p}")
            }
        })
        .collect()
}

/// Every path a file refers to, as written (`crate::x::y`, `super::z`, `stepcast::w`).
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // use declarations, braces and all
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(end) = rest.find(';') {
            out.extend(expand(&rest[..end]));
        }
    }
    // qualified paths anywhere
    for root in ["crate::", "super::", "stepcast::"] {
        let mut rest = code;
        while let Some(at) = rest.find(root) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                out.push(tail[..end].trim_end_matches(':').to_string());
            }
            rest = &rest[at + root.len()..];
        }
    }
    out
}

/// The crate-relative module path a written path points into, from module `here`.
fn resolve(path: &str, here: &[String], in_binary: bool) -> Option<Vec<String>> {
    let mut segs: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = match *segs.first()? {
        "crate" => {
            segs.remove(0);
            if in_binary {
                vec!["cli".into()]
            } else {
                Vec::new()
            }
        }
        "stepcast" => {
            segs.remove(0);
            Vec::new()
        }
        "super" => {
            let mut b = here.to_vec();
            while segs.first() == Some(&"super") {
                segs.remove(0);
                b.pop();
            }
            b
        }
        _ => return None,
    };
    base.extend(segs.iter().map(|s| s.to_string()));
    Some(base)
}

/// Items the crate root re-exports, and the module they come from.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("Error", "error"),
    ("Result", "error"),
    ("named_enum", "named"),
];

fn level(module: &str) -> Option<usize> {
    LEVELS.iter().position(|l| l.contains(&module))
}

struct Graph {
    /// (user, used) → an example of the path
    modules: BTreeMap<(String, String), String>,
    /// sibling files of one directory: (user, used) → example
    files: BTreeMap<(String, String), String>,
}

fn graph() -> Graph {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let file_modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    let mut g = Graph {
        modules: BTreeMap::new(),
        files: BTreeMap::new(),
    };
    for file in &files {
        let here = module_of(file);
        let in_binary = here.first().is_some_and(|m| m == "cli")
            || here.is_empty() && file.ends_with("main.rs");
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        // code of test modules is not part of the architecture
        let code = code.split("#[cfg(test)]").next().unwrap();
        for p in paths(code) {
            let Some(target) = resolve(&p, &here, in_binary) else {
                continue;
            };
            let (Some(from), Some(to)) = (here.first(), target.first()) else {
                continue;
            };
            let to = &ROOT_ITEMS
                .iter()
                .find(|(item, _)| item == to)
                .map_or(to.clone(), |(_, m)| m.to_string());
            if from != to {
                g.modules
                    .entry((from.clone(), to.clone()))
                    .or_insert_with(|| format!("{}: {p}", file.display()));
            }
            // the deepest file the target lies in
            let mut t = target.clone();
            while !t.is_empty() && !file_modules.contains(&t) {
                t.pop();
            }
            let siblings = here.len() == t.len()
                && here.len() > 1
                && here[..here.len() - 1] == t[..t.len() - 1]
                && here != t;
            if siblings {
                g.files
                    .entry((here.join("/"), t.join("/")))
                    .or_insert_with(|| format!("{}: {p}", file.display()));
            }
        }
    }
    g
}

/// A cycle among the edges, if there is one.
fn cycle(edges: &BTreeMap<(String, String), String>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| *s == n) {
            return Some(stack[i..].iter().map(|s| s.to_string()).collect());
        }
        if !done.insert(n) {
            return None;
        }
        stack.push(n);
        for m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for n in next.keys() {
        if let Some(c) = visit(n, &next, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn modules_depend_downward_only() {
    let g = graph();
    let mut upward = Vec::new();
    for ((from, to), example) in &g.modules {
        match (level(from), level(to)) {
            (Some(a), Some(b)) if b <= a => {}
            (a, b) => upward.push(format!(
                "{from} (layer {a:?}) uses {to} (layer {b:?}): {example}"
            )),
        }
    }
    assert!(
        upward.is_empty(),
        "edges pointing up:\n{}",
        upward.join("\n")
    );
    assert_eq!(cycle(&g.modules), None, "a cycle between modules");
    // every module has a layer
    for entry in std::fs::read_dir(src()).unwrap() {
        let name = entry
            .unwrap()
            .file_name()
            .to_string_lossy()
            .replace(".rs", "");
        if !["lib", "main"].contains(&name.as_str()) {
            assert!(level(&name).is_some(), "src/{name} has no layer in LEVELS");
        }
    }
}

#[test]
fn no_two_files_of_a_directory_use_each_other() {
    let g = graph();
    assert_eq!(cycle(&g.files), None, "a cycle between sibling files");
}

#[test]
fn the_library_does_not_depend_on_clap() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for f in files {
        let m = module_of(&f);
        if m.first().is_some_and(|m| m == "cli") || f.ends_with("main.rs") {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&f).unwrap());
        assert!(!code.contains("clap"), "{} uses clap", f.display());
    }
}

#[test]
fn plan_predict_and_schedule_keep_functions_short() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for dir in SHORT_FUNCTION_DIRS {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let code = code_only(&text);
            let lines: Vec<&str> = code.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let t = line.trim_start();
                let is_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn "]
                    .iter()
                    .any(|p| t.starts_with(p));
                if !is_fn {
                    continue;
                }
                // the function ends where its braces balance
                let mut depth = 0i32;
                let mut opened = false;
                for (j, l) in lines[i..].iter().enumerate() {
                    for c in l.chars() {
                        match c {
                            '{' => {
                                depth += 1;
                                opened = true;
                            }
                            '}' => depth -= 1,
                            ';' if !opened => break,
                            _ => {}
                        }
                    }
                    if (opened && depth == 0) || (!opened && l.contains(';')) {
                        if j + 1 > LONGEST_FUNCTION {
                            long.push(format!("{}:{} ({} lines)", f.display(), i + 1, j + 1));
                        }
                        break;
                    }
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn use_trees_expand() {
    assert_eq!(
        expand("crate::{a::b, c::{d, e as f}, g::self}"),
        vec!["crate::a::b", "crate::c::d", "crate::c::e", "crate::g"]
    );
    assert_eq!(
        resolve(
            "super::super::x::y",
            &["a".into(), "b".into(), "c".into()],
            false
        ),
        Some(vec!["a".to_string(), "x".into(), "y".into()])
    );
}
