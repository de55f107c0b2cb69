//! The layering rule of ARCHITECTURE.md, checked from the source: every `crate::` path in a
//! module names a module of a lower layer (or the module itself), and no files import each
//! other in a circle, each name followed through the `use` declarations of the modules on
//! its way (re-exports of a folder's `mod.rs`, names a child reaches through `super::`) to
//! the file that defines it. Reads `src/` as text; nothing is compiled or run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers from the ground up; a module may use only the modules of lower layers.
const LAYERS: &[&[&str]] = &[
    // The wire and small helpers: no I/O, no knowledge of the rest.
    &["hex", "clock", "sync", "protocol", "budget"],
    // Observability leaves: take what they need by injection.
    &["metrics", "traces", "logging"],
    &["access"],
    &["confine", "egress", "workspace", "uploads"],
    &["agent"],
    &["store"],
    // Thread leases; the webhook outbox's events and their delivery (its HTTP client lent).
    &["cluster", "webhooks"],
    &["runtime"],
    &["http"],
    &["config"],
    &["server", "cli"],
];

/// Inside a module, its own layers, from the ground up: `(module, [[child, ...], ...])`.
/// A child named `""` is the module's own file (`mod.rs`): in `http` the route table's
/// wiring on top; in `runtime` and `agent::acp` the handle their children implement on
/// (`Runtime`, `Inner`) and the names they share, at the ground. A module's own file
/// composes its children; its paths into them are not read as imports.
const INNER_LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "http",
        &[
            // The ground: bodies, and the one place that picks error statuses.
            &["body", "error"],
            // Listeners, TLS, limits, the HTTP clients: no routes.
            &["transport"],
            // The route table, middleware, handlers, forwarding as a layer.
            &["api"],
            &[""],
        ],
    ),
    (
        "runtime",
        &[
            // The facade, errors, and what knows nothing of threads or runs.
            &[
                "",
                "errors",
                "memory",
                "suspension",
                "translator",
                "ui",
                "history",
                "sanitize",
            ],
            // The replay ring, the state document, a live run, leases, admission.
            &["journal", "state", "live", "lease", "admission"],
            // A stream's reader; the live runs by id.
            &["attach", "runs"],
            &["thread"],
            &["queue", "notices"],
            // The threads in memory; answers to a suspended run; a rewind.
            &["cache", "answer", "rewind"],
            // A run from its start to its end.
            &["run"],
            // What reads or drives the rest.
            &[
                "reattach", "sessions", "fleet", "schedule", "observe", "warm",
            ],
        ],
    ),
    (
        "agent::acp",
        &[
            // The handle, and what knows no process: the router of an agent's messages,
            // the update translator, its ways out, parts, usage, settings a client sends.
            &[
                "",
                "forwarded",
                "exits",
                "forward",
                "router",
                "translate",
                "parts",
                "usage",
            ],
            &["config", "mcp", "transcript", "elicit", "prompt"],
            // The command line of a process; permissions asked of a person.
            &["launch", "permission"],
            &["process"],
            &["workdir", "settings", "health"],
            &["pool"],
            &["bind"],
            &["bindings", "prepare", "spares", "sessions", "steer"],
            // A turn.
            &["turn"],
        ],
    ),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The inner layer of a child of `module` (`None`: `module` has no inner layers).
fn inner_layer_of(module: &str, child: &str) -> Option<usize> {
    let (_, layers) = INNER_LAYERS.iter().find(|(m, _)| *m == module)?;
    layers.iter().position(|layer| layer.contains(&child))
}

/// The source with comments and string literals blanked, so a path in a doc comment or a
/// message is not an import.
fn code_only(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            i += end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|c| *c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            let end = rest[body..]
                .find(&close)
                .map_or(rest.len(), |e| body + e + close.len());
            out.push_str("\"\"");
            i += end;
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            out.push_str("\"\"");
            i += (j + 1).min(rest.len());
        } else if rest.starts_with("'\"'") {
            out.push_str("' '");
            i += 3;
        } else {
            let c = rest.chars().next().expect("rest is not empty");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Every `crate::` path, each leaf of a group its own: `crate::a::X`, `crate::{a::X, b}`,
/// `crate::a::{b::Y, c}`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        paths.extend(use_tree(path_text(rest)).into_iter().map(|(_, path)| path));
    }
    paths.retain(|p| !p.is_empty());
    paths
}

/// The path at the start of `rest`: its segments and the groups they end with, braces
/// balanced (`a::{b::C, d}` of `a::{b::C, d};`).
fn path_text(rest: &str) -> &str {
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return &rest[..i],
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &rest[..=i];
                }
            }
            _ if depth > 0 || c.is_alphanumeric() || c == '_' || c == ':' => {}
            _ => return &rest[..i],
        }
    }
    rest
}

/// The leading `a::b::c` of a path, as its segments.
fn segments(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        out.push(ident);
        match rest.trim_start().strip_prefix("::") {
            Some(next) => rest = next.trim_start(),
            None => break,
        }
    }
    out
}

/// Every `.rs` file under `dir`, as a path relative to `src/`.
fn sources(src: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(src, &mut out);
    out.iter()
        .map(|p| p.strip_prefix(src).expect("under src/").to_owned())
        .collect()
}

/// The module path a file defines: `runtime/mod.rs` -> `runtime`, `http/routes.rs` ->
/// `http::routes`.
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

struct Import {
    from: PathBuf,
    to: Vec<String>,
}

fn imports() -> (Vec<Import>, BTreeMap<Vec<String>, PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    let by_module: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs") && !f.ends_with("lib.rs"))
        .map(|f| (module_of(f), f.clone()))
        .collect();
    let mut out = Vec::new();
    for file in &files {
        if file.ends_with("main.rs") || file.ends_with("lib.rs") {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(src.join(file)).expect("a source file"));
        // A file's tests (at its end) import their own file through `super`, and may use
        // any layer: only the code above them is read.
        let code = match code.find("#[cfg(test)]\nmod ") {
            Some(at) => code[..at].to_owned(),
            None => code,
        };
        for path in crate_paths(&code) {
            out.push(Import {
                from: file.clone(),
                to: path,
            });
        }
        // `super::` from a child names its parent's module; resolved like `crate::`.
        let module = module_of(file);
        let mut rest = code.as_str();
        while let Some(at) = rest.find("super::") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "super::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            // A `mod tests` child inside the file: `super` is the file itself.
            let parent = &module[..module.len().saturating_sub(1)];
            let names = use_tree(path_text(rest)).into_iter().map(|(_, path)| path);
            for name in names.filter(|n| !n.is_empty()) {
                if name[0] == "super" || parent.is_empty() {
                    continue;
                }
                let mut to = parent.to_vec();
                to.extend(name);
                out.push(Import {
                    from: file.clone(),
                    to,
                });
            }
        }
    }
    (out, by_module)
}

#[test]
fn every_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let unplaced: BTreeSet<String> = sources(&src)
        .iter()
        .filter(|f| !f.ends_with("main.rs") && !f.ends_with("lib.rs"))
        .map(|f| module_of(f)[0].clone())
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/layers.rs: {unplaced:?}"
    );
}

#[test]
fn imports_run_down_the_layers() {
    let (imports, _) = imports();
    let mut upward = BTreeSet::new();
    for import in &imports {
        let from = module_of(&import.from)[0].clone();
        let to = &import.to[0];
        if *to == from {
            continue;
        }
        let (Some(a), Some(b)) = (layer_of(&from), layer_of(to)) else {
            continue;
        };
        if b >= a {
            upward.insert(format!(
                "{} uses crate::{} ({from} is layer {a}, {to} is layer {b})",
                import.from.display(),
                import.to.join("::")
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports that do not run down the layers:\n{}",
        upward.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn imports_run_down_the_layers_inside_a_module() {
    let (imports, files) = imports();
    let uses = uses(&files);
    let upward = upward_inside(&imports, &|path| defining_file(path, &files, &uses, 0));
    assert!(
        upward.is_empty(),
        "imports that do not run down a module's inner layers:\n{}",
        upward.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The imports of `imports` that run up a module's inner layers, each name taken to the
/// child of the module whose file defines it (`defining`; where it finds none, the child
/// the path names, else the module's own file).
fn upward_inside(
    imports: &[Import],
    defining: &dyn Fn(&[String]) -> Option<PathBuf>,
) -> BTreeSet<String> {
    let mut upward = BTreeSet::new();
    for import in imports {
        let from = module_of(&import.from);
        let to = &import.to;
        for (module, _) in INNER_LAYERS {
            let inside: Vec<String> = path(module);
            let n = inside.len();
            let within = |p: &[String]| p.len() >= n && p[..n] == inside[..];
            if !within(&from) || !within(to) {
                continue;
            }
            let child = |p: &[String]| p.get(n).cloned().unwrap_or_default();
            // (A name defined outside the module, re-exported by a child, is no inner
            // import.)
            let defined_in = defining(to)
                .map(|file| module_of(&file))
                .filter(|file| within(file));
            let (a, b) = (child(&from), child(defined_in.as_deref().unwrap_or(to)));
            let a_layer = inner_layer_of(module, &a);
            // A path to an item of the module's own file (`crate::http::Auth`) names its
            // face.
            let b_layer = inner_layer_of(module, &b).or_else(|| inner_layer_of(module, ""));
            match (a_layer, b_layer) {
                (Some(x), Some(y)) if y > x => {
                    upward.insert(format!(
                        "{} uses crate::{} ({module}::{a} is inner layer {x}, {module}::{b} is {y})",
                        import.from.display(),
                        to.join("::")
                    ));
                }
                (None, _) => {
                    upward.insert(format!(
                        "{} has no inner layer of {module}",
                        import.from.display()
                    ));
                }
                _ => {}
            }
        }
    }
    upward
}

/// What the `use` declarations of each module's file bring into scope: `module -> name ->
/// the absolute path it stands for` (a private `use` counts: the module's children see it
/// through `super::`).
type Uses = BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>;

fn uses(files: &BTreeMap<Vec<String>, PathBuf>) -> Uses {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Uses::new();
    for (module, file) in files {
        let code = code_only(&std::fs::read_to_string(src.join(file)).expect("a source file"));
        let code = match code.find("#[cfg(test)]\nmod ") {
            Some(at) => code[..at].to_owned(),
            None => code,
        };
        let table = out.entry(module.clone()).or_default();
        let mut rest = code.as_str();
        while let Some(at) = rest.find("use ") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "use ".len()..];
            if before.is_some_and(|c| !(c == '\n' || c == ' ' || c == ')' || c == '{')) {
                continue;
            }
            let end = rest.find(';').unwrap_or(rest.len());
            let tree = &rest[..end];
            rest = &rest[end..];
            for (name, path) in use_tree(tree) {
                let Some(first) = path.first() else { continue };
                let absolute = match first.as_str() {
                    "crate" => path[1..].to_vec(),
                    "self" => [module.clone(), path[1..].to_vec()].concat(),
                    "super" => {
                        let mut at = module.clone();
                        let mut p = path.as_slice();
                        while p.first().is_some_and(|s| s == "super") {
                            at.pop();
                            p = &p[1..];
                        }
                        [at, p.to_vec()].concat()
                    }
                    child
                        if files
                            .contains_key(&[module.clone(), vec![child.to_owned()]].concat()) =>
                    {
                        [module.clone(), path.clone()].concat()
                    }
                    _ => continue, // another crate's
                };
                table.insert(name, absolute);
            }
        }
    }
    out
}

/// The leaves of a `use` tree (`a::{b::C, D as E}`): each name it binds with its path.
fn use_tree(tree: &str) -> Vec<(String, Vec<String>)> {
    fn walk(prefix: &[String], text: &str, out: &mut Vec<(String, Vec<String>)>) {
        let text = text.trim();
        // Split at the top-level `{`.
        if let Some(open) = text.find('{') {
            let mut path = prefix.to_vec();
            path.extend(segments(text[..open].trim_end_matches("::").trim()));
            let inner = &text[open + 1..text.rfind('}').unwrap_or(text.len())];
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(&path, &item, out);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            walk(&path, &item, out);
            return;
        }
        let (path_text, alias) = match text.split_once(" as ") {
            Some((p, a)) => (p, Some(a.trim().to_owned())),
            None => (text, None),
        };
        let mut path = prefix.to_vec();
        path.extend(segments(path_text));
        if path.last().is_some_and(|l| l == "self") {
            path.pop();
        }
        let Some(last) = path.last().cloned() else {
            return;
        };
        if text.ends_with('*') || alias.as_deref() == Some("_") {
            return;
        }
        out.push((alias.unwrap_or(last), path));
    }
    let mut out = Vec::new();
    walk(&[], tree, &mut out);
    out
}

/// The file that defines what `path` names: down the modules, through each `use` that
/// brings the next name into a module (re-exports, and names a child reaches through
/// `super::`), to the file of the module that defines it.
fn defining_file(
    path: &[String],
    files: &BTreeMap<Vec<String>, PathBuf>,
    uses: &Uses,
    depth: usize,
) -> Option<PathBuf> {
    let mut module = vec![path.first()?.clone()];
    files.get(&module)?;
    for (i, name) in path.iter().enumerate().skip(1) {
        let child = [module.clone(), vec![name.clone()]].concat();
        if files.contains_key(&child) {
            module = child;
            continue;
        }
        if depth < 8
            && let Some(target) = uses.get(&module).and_then(|t| t.get(name))
            && target.as_slice() != &path[..=i]
        {
            let onward = [target.clone(), path[i + 1..].to_vec()].concat();
            if let Some(file) = defining_file(&onward, files, uses, depth + 1) {
                return Some(file);
            }
        }
        break;
    }
    files.get(&module).cloned()
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let (imports, files) = imports();
    let uses = uses(&files);
    let edges = file_edges(&imports, &files, &uses);
    // Tarjan's strongly connected components; any of two or more files is a circle.
    let circles = strongly_connected(&edges);
    let circles: Vec<String> = circles
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            c.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    assert!(
        circles.is_empty(),
        "files that import each other in a circle:\n{}",
        circles.join("\n")
    );
}

/// `from -> to` for every import, `to` the file that defines what it names.
fn file_edges(
    imports: &[Import],
    files: &BTreeMap<Vec<String>, PathBuf>,
    uses: &Uses,
) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for import in imports {
        if let Some(to) = defining_file(&import.to, files, uses, 0)
            && to != import.from
        {
            edges.entry(import.from.clone()).or_default().insert(to);
        }
    }
    edges
}

fn path(text: &str) -> Vec<String> {
    text.split("::").map(str::to_owned).collect()
}

/// A planted circle between two files that reach each other only through their folder's
/// `mod.rs` (`super::Y`, re-exported there from the other file) is found.
#[test]
fn a_circle_through_a_folder_s_re_exports_is_found() {
    let files: BTreeMap<Vec<String>, PathBuf> =
        [("a", "a/mod.rs"), ("a::x", "a/x.rs"), ("a::y", "a/y.rs")]
            .into_iter()
            .map(|(m, f)| (path(m), PathBuf::from(f)))
            .collect();
    let uses: Uses = [(
        path("a"),
        [
            ("X".to_owned(), path("a::x::X")),
            ("Y".to_owned(), path("a::y::Y")),
        ]
        .into_iter()
        .collect(),
    )]
    .into_iter()
    .collect();
    let imports = [
        Import {
            from: PathBuf::from("a/x.rs"),
            to: path("a::Y"),
        },
        Import {
            from: PathBuf::from("a/y.rs"),
            to: path("a::X"),
        },
    ];
    let circles: Vec<_> = strongly_connected(&file_edges(&imports, &files, &uses))
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert_eq!(circles.len(), 1, "{circles:?}");
    // Read as the folder's face, the same imports show no circle: what the test did before.
    let faceless = file_edges(&imports, &files, &Uses::new());
    assert!(strongly_connected(&faceless).iter().all(|c| c.len() == 1));
}

/// A planted `super::` import from a lower inner layer of `http` to a higher one is found.
#[test]
fn an_upward_super_import_inside_a_module_is_found() {
    let planted = Import {
        from: PathBuf::from("http/body.rs"),
        to: path("http::api::Route"),
    };
    let upward = upward_inside(&[planted], &|_| None);
    assert_eq!(upward.len(), 1, "{upward:?}");
    let downward = Import {
        from: PathBuf::from("http/api/mod.rs"),
        to: path("http::body::Body"),
    };
    assert!(upward_inside(&[downward], &|_| None).is_empty());
    // Inside a folder of a folder, and through a re-export of the folder's own file: the
    // name counts where it is defined.
    let planted = Import {
        from: PathBuf::from("agent/acp/router.rs"),
        to: path("agent::acp::Reexported"),
    };
    let defined_in_turn = |_: &[String]| Some(PathBuf::from("agent/acp/turn.rs"));
    assert_eq!(upward_inside(&[planted], &defined_in_turn).len(), 1);
}

/// `use` trees are read leaf by leaf, with their aliases.
#[test]
fn use_trees_are_read_leaf_by_leaf() {
    let leaves = use_tree("super::{a::B, c::{D as E, self}, F}");
    let names: Vec<(&str, String)> = leaves
        .iter()
        .map(|(n, p)| (n.as_str(), p.join("::")))
        .collect();
    assert_eq!(
        names,
        [
            ("B", "super::a::B".to_owned()),
            ("E", "super::c::D".to_owned()),
            ("c", "super::c".to_owned()),
            ("F", "super::F".to_owned()),
        ]
    );
}

fn strongly_connected(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.out
}

#[test]
fn the_reader_finds_paths_in_code_and_not_in_comments() {
    let code = code_only(
        "use crate::{a::X, b::{c::Y, Z}};\n// crate::d::W\nlet s = \"crate::e\";\nf(crate::g::h());",
    );
    let paths: Vec<String> = crate_paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(paths, ["a::X", "b::c::Y", "b::Z", "g::h"]);
}

/// Which files may name an outside crate: `(crate path, the src/ prefixes allowed)`.
const CRATE_OWNERS: &[(&str, &[&str])] = &[
    // Only the HTTP layer knows hyper (and its utilities and TLS connector).
    ("hyper::", &["http/"]),
    ("hyper_util::", &["http/"]),
    ("hyper_rustls::", &["http/"]),
    // Only the store (and the cluster's own registry on the same database) knows SQL.
    ("rusqlite::", &["store/"]),
    ("tokio_postgres::", &["store/", "cluster/"]),
    // Cron expressions and time zones are the schedules' own.
    ("croner::", &["runtime/schedule/"]),
    ("jiff::", &["runtime/schedule/"]),
    // The protocol does no I/O.
    (
        "tokio::",
        &[
            "access/",
            "agent/",
            "cli/",
            "cluster/",
            "confine",
            "egress/",
            "http/",
            "logging.rs",
            "metrics/",
            "runtime/",
            "server.rs",
            "store/",
            "traces.rs",
            "uploads",
            "webhooks/",
            "workspace/",
        ],
    ),
];

#[test]
fn outside_crates_are_named_only_by_their_owners() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut strays = Vec::new();
    for file in sources(&src) {
        let code = code_only(&std::fs::read_to_string(src.join(&file)).expect("a source file"));
        let path = file.to_string_lossy().into_owned();
        for (krate, owners) in CRATE_OWNERS {
            let named = code.match_indices(krate).any(|(at, _)| {
                !code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            });
            if named && !owners.iter().any(|owner| path.starts_with(owner)) && path != "main.rs" {
                strays.push(format!("{path} names {krate}"));
            }
        }
    }
    assert!(
        strays.is_empty(),
        "crates named outside their owners:\n{}",
        strays.join("\n")
    );
}

/// Most lines of code (not blank, not only a comment) a file of `src/` may hold, its tests
/// apart.
const MAX_FILE_LINES: usize = 600;

/// Most lines of code a function may hold without a comment above it that starts
/// `// Over 80 lines:` and says why.
const MAX_FUNCTION_LINES: usize = 80;

/// A file's lines before its test module (`#[cfg(test)] mod … {`); none for a file that is
/// all tests (`tests.rs`, or under a `tests/` folder).
fn non_test_lines(file: &Path, source: &str) -> Vec<String> {
    if file.ends_with("tests.rs") || file.iter().any(|part| part == "tests") {
        return Vec::new();
    }
    let lines: Vec<String> = source.lines().map(str::to_owned).collect();
    let end = lines
        .windows(2)
        .position(|pair| {
            pair[0].trim() == "#[cfg(test)]"
                && pair[1].trim_start().starts_with("mod ")
                && pair[1].trim_end().ends_with('{')
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

fn is_code(line: &str) -> bool {
    let line = line.trim();
    !line.is_empty() && !line.starts_with("//")
}

/// Each function with a body: `(name, lines of code, the comment lines just above it and
/// its attributes)`. A body ends at the first `}` line at the indentation of its `fn`, which
/// is where rustfmt puts it.
fn functions(lines: &[String]) -> Vec<(String, usize, Vec<String>)> {
    let mut out = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let code = code_only(line);
        let trimmed = code.trim_start();
        let unscoped = match trimmed.strip_prefix("pub(in ") {
            Some(rest) => rest.split_once(") ").map_or(rest, |(_, r)| r),
            None => trimmed,
        };
        let Some(after) = ["", "pub ", "pub(crate) ", "pub(super) "]
            .iter()
            .filter_map(|vis| unscoped.strip_prefix(vis))
            .flat_map(|rest| {
                ["", "const ", "async ", "unsafe ", "const unsafe "]
                    .map(|q| rest.strip_prefix(q).and_then(|r| r.strip_prefix("fn ")))
            })
            .flatten()
            .next()
        else {
            continue;
        };
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let indent = line.len() - line.trim_start().len();
        // A declaration (`fn f();`) has no body.
        let opens = lines[at..]
            .iter()
            .map(|l| code_only(l))
            .find(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
        if opens.is_none_or(|l| l.trim_end().ends_with(';')) {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(end) = lines[at..].iter().position(|l| l.starts_with(&close)) else {
            continue;
        };
        let size = lines[at..=at + end].iter().filter(|l| is_code(l)).count();
        let above: Vec<String> = lines[..at]
            .iter()
            .rev()
            .map(|l| l.trim().to_owned())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["))
            .collect();
        out.push((name, size, above));
    }
    out
}

/// Files and functions over their size, each with its size.
fn oversized(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for file in sources(src) {
        let source = std::fs::read_to_string(src.join(&file)).expect("a source file");
        let lines = non_test_lines(&file, &source);
        let size = lines.iter().filter(|l| is_code(l)).count();
        if size > MAX_FILE_LINES {
            out.push(format!("{}: {size} lines", file.display()));
        }
        for (name, size, above) in functions(&lines) {
            let reason = above.iter().any(|l| l.starts_with("// Over 80 lines: "));
            if size > MAX_FUNCTION_LINES && !reason {
                out.push(format!("{}::{name}: {size} lines", file.display()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn files_and_functions_keep_to_their_sizes() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let over = oversized(&src);
    assert!(
        over.is_empty(),
        "over {MAX_FILE_LINES} lines a file or {MAX_FUNCTION_LINES} a function \
         (a function may say why above it, `// Over 80 lines: …`):\n{}",
        over.join("\n")
    );
}

#[test]
fn a_long_function_and_a_long_file_are_found() {
    let dir = std::env::temp_dir().join(format!("layers-sizes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let body = "    let x = 1;\n".repeat(MAX_FUNCTION_LINES);
    let long = format!("/// Long.\npub(crate) async fn long() {{\n{body}}}\n");
    let said = format!("// Over 80 lines: one table.\nfn said() {{\n{body}}}\n");
    let scoped = format!("pub(in crate::a) fn scoped(b: Vec<()>) -> u8 {{\n{body}}}\n");
    let tests = format!("#[cfg(test)]\nmod tests {{\n    fn hidden() {{\n{body}    }}\n}}\n");
    std::fs::write(dir.join("a.rs"), format!("{long}{said}{scoped}{tests}")).expect("a file");
    std::fs::write(dir.join("b.rs"), "fn x() {}\n".repeat(MAX_FILE_LINES + 1)).expect("a file");
    let over = oversized(&dir);
    std::fs::remove_dir_all(&dir).expect("removed");
    assert_eq!(
        over,
        [
            format!("a.rs::long: {} lines", MAX_FUNCTION_LINES + 2),
            format!("a.rs::scoped: {} lines", MAX_FUNCTION_LINES + 2),
            format!("b.rs: {} lines", MAX_FILE_LINES + 1),
        ]
    );
}
