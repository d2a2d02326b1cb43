//! The code's shape, checked: the modules of every crate import one
//! another in layers, and no function is too long to read.
//!
//! Layers: no chain of `crate::`, `super::` or `self::` paths, in `use`
//! items or written out in code, leads from a module back to itself.
//!
//! The check follows each crate's `mod` declarations from its root file,
//! parses every file with `syn`, and resolves each path to the module it
//! names (through `pub use` re-exports). A path from module `a::x` to
//! `b::y` is an arrow between the siblings `a` and `b` under their common
//! parent; a module naming its own ancestor's items (a child using its
//! parent's trait) or its own descendants is no arrow. Every folder's
//! siblings must then form no cycle. Test code (`#[cfg(test)]`) is left out:
//! only what ships has to be layered.
//!
//! `docs/architecture.md` draws the layers this keeps; to redraw them,
//! `SLUICE_PRINT_ARROWS=1 cargo test --test integration shape -- --nocapture`
//! prints every arrow between a crate's top-level modules with the place
//! that draws it.
//!
//! Length: no function or method that ships is longer than
//! [`MAX_FUNCTION_LINES`], from `fn` to its closing brace; a longer one is
//! split by what it does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use syn::visit::Visit;

/// Every crate of the workspace: its name and its root files.
const CRATES: &[(&str, &[&str])] = &[
    ("sluice-engine", &["engine/src/lib.rs"]),
    ("sluice-kafka", &["kafka-sink/src/lib.rs"]),
    ("sluice-sql", &["sql/src/lib.rs"]),
    ("sluice-nexmark", &["nexmark/src/lib.rs"]),
    ("sluice-jdbc", &["jdbc/src/lib.rs"]),
    ("sluice-status", &["status/src/lib.rs"]),
    ("sluice", &["src/lib.rs", "src/main.rs"]),
];

#[test]
fn no_crate_of_the_workspace_has_an_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = String::new();
    for (name, roots) in CRATES {
        for file in *roots {
            let graph = ModuleGraph::read(root, file).expect("the crate's files parse");
            if std::env::var_os("SLUICE_PRINT_ARROWS").is_some() {
                for ((from, to), place) in graph.arrows.get(&Vec::new()).into_iter().flatten() {
                    println!("{name}: {from} -> {to}  {place}");
                }
            }
            for cycle in graph.cycles() {
                let _ = writeln!(found, "{name} ({file}): {cycle}");
            }
        }
    }
    assert!(
        found.is_empty(),
        "modules import one another in a cycle; move the shared item down \
         a layer (docs/architecture.md draws the layers):\n{found}"
    );
}

#[test]
fn a_cycle_is_named_with_the_files_and_lines_that_close_it() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shape");

    let layered = ModuleGraph::read(&fixtures, "layered/lib.rs").expect("parses");
    assert_eq!(layered.cycles(), Vec::<String>::new());
    assert!(
        layered.arrow_count() >= 3,
        "the layered fixture's downward arrows are seen: {:?}",
        layered.arrows
    );

    let cyclic = ModuleGraph::read(&fixtures, "cyclic/lib.rs").expect("parses");
    let cycles = cyclic.cycles();
    assert_eq!(cycles.len(), 2, "{cycles:#?}");
    // The top-level loop closes through a re-export (`crate::Plan` is
    // `planner::Plan`), and the one inside a folder through `super::`.
    assert!(
        cycles[0].starts_with("crate: epoch -> planner -> epoch"),
        "{}",
        cycles[0]
    );
    assert!(
        cycles[0].contains("epoch.rs:3 `crate::Plan`"),
        "{}",
        cycles[0]
    );
    assert!(cycles[0].contains("planner/split.rs:"), "{}", cycles[0]);
    assert!(cycles[0].contains("`crate::epoch::Epoch`"), "{}", cycles[0]);
    assert!(
        cycles[1].starts_with("crate::planner: bind -> split -> bind"),
        "{}",
        cycles[1]
    );
    assert!(cycles[1].contains("`super::split::Split`"), "{}", cycles[1]);
    assert!(cycles[1].contains("`super::bind::bind`"), "{}", cycles[1]);
}

/// The most lines a function that ships may take, from `fn` to its
/// closing brace.
const MAX_FUNCTION_LINES: usize = 150;

#[test]
fn no_function_that_ships_is_longer_than_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for (_, roots) in CRATES {
        for file in *roots {
            let graph = ModuleGraph::read(root, file).expect("the crate's files parse");
            long.extend(graph.long_functions);
        }
    }
    long.sort();
    long.dedup();
    assert!(
        long.is_empty(),
        "functions longer than {MAX_FUNCTION_LINES} lines; split each by what it does:\n{}",
        long.join("\n")
    );
}

#[test]
fn a_long_function_is_named_with_its_line_and_length() {
    let body = "    let _ = 1;\n".repeat(MAX_FUNCTION_LINES - 2);
    let text = format!(
        "fn short() {{}}\n\nfn long() {{\n{body}}}\n\n#[cfg(test)]\nfn long_test() {{\n{body}    let _ = 2;\n}}\n\nstruct S;\nimpl S {{\n    fn method(&self) {{\n{body}        let _ = 2;\n    }}\n}}\n"
    );
    let file = syn::parse_file(&text).expect("parses");
    let mut paths = Paths::default();
    for item in &file.items {
        paths.visit_item(item);
    }
    // `long` is exactly at the limit, `method` one over; the test-only
    // function is not counted.
    let method_line = text
        .lines()
        .position(|l| l.contains("fn method"))
        .map(|i| i + 1);
    assert_eq!(
        paths.long_functions,
        vec![(
            "method".to_string(),
            method_line.unwrap_or(0),
            MAX_FUNCTION_LINES + 1
        )]
    );
}

/// One crate's modules and the arrows between siblings.
#[derive(Debug, Default)]
struct ModuleGraph {
    /// Where places are shown from.
    base: std::path::PathBuf,
    /// Every module's path from the crate root (`[]` is the root).
    modules: BTreeSet<Vec<String>>,
    /// Re-exports: (module, name) → the path the name stands for.
    reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
    /// Every path to resolve: the module it is written in, and where.
    uses: Vec<Use>,
    /// parent → (from, to) → the first place that draws it.
    arrows: BTreeMap<Vec<String>, BTreeMap<(String, String), String>>,
    /// `file:line name (n lines)` of each function over the limit.
    long_functions: Vec<String>,
}

#[derive(Debug)]
struct Use {
    module: Vec<String>,
    path: Vec<String>,
    place: String,
}

impl ModuleGraph {
    /// Reads the crate whose root file is `file`, a path from `base`
    /// (places are shown from `base`).
    fn read(base: &Path, file: &str) -> Result<Self, String> {
        let mut graph = ModuleGraph {
            base: base.to_path_buf(),
            ..ModuleGraph::default()
        };
        let root = base.join(file);
        let dir = root
            .parent()
            .ok_or("a root file has a folder")?
            .to_path_buf();
        graph.read_file(&root, Vec::new(), &dir)?;
        let uses = std::mem::take(&mut graph.uses);
        for u in &uses {
            graph.add_arrow(u);
        }
        Ok(graph)
    }

    /// Reads the file of `module`; `dir` is where its child modules' files are.
    fn read_file(&mut self, file: &Path, module: Vec<String>, dir: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let shown = file
            .strip_prefix(&self.base)
            .unwrap_or(file)
            .display()
            .to_string();
        self.read_items(&parsed.items, module, dir, &shown)
    }

    fn read_items(
        &mut self,
        items: &[syn::Item],
        module: Vec<String>,
        dir: &Path,
        file: &str,
    ) -> Result<(), String> {
        self.modules.insert(module.clone());
        // A `use` may start at a child module declared here (`use planner::Plan`).
        let children: BTreeSet<String> = items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Mod(m) => Some(m.ident.to_string()),
                _ => None,
            })
            .collect();
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut child = module.clone();
                    child.push(name.clone());
                    match &m.content {
                        Some((_, inner)) => {
                            self.read_items(inner, child, &dir.join(&name), file)?
                        }
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            let (path, child_dir) = if flat.exists() {
                                (flat, dir.join(&name))
                            } else {
                                (dir.join(&name).join("mod.rs"), dir.join(&name))
                            };
                            self.read_file(&path, child, &child_dir)?;
                        }
                    }
                }
                syn::Item::Use(u) => {
                    let mut paths = Vec::new();
                    flatten(&u.tree, Vec::new(), &mut paths);
                    let line = u.use_token.span.start().line;
                    for (mut path, alias) in paths {
                        if path.first().is_some_and(|p| children.contains(p)) {
                            path.insert(0, "self".to_string());
                        }
                        let Some(absolute) = resolve(&module, &path) else {
                            continue;
                        };
                        if !matches!(u.vis, syn::Visibility::Inherited) {
                            if let Some(alias) = alias {
                                self.reexports
                                    .insert((module.clone(), alias), absolute.clone());
                            }
                        }
                        self.uses.push(Use {
                            module: module.clone(),
                            path: absolute,
                            place: format!("{file}:{line} `{}`", path.join("::")),
                        });
                    }
                }
                other => {
                    let mut paths = Paths::default();
                    paths.visit_item(other);
                    for (name, line, lines) in paths.long_functions {
                        self.long_functions
                            .push(format!("{file}:{line} {name} ({lines} lines)"));
                    }
                    for (path, line) in paths.found {
                        if let Some(absolute) = resolve(&module, &path) {
                            self.uses.push(Use {
                                module: module.clone(),
                                path: absolute,
                                place: format!("{file}:{line} `{}`", path.join("::")),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The module a path names: its longest prefix that is a module, after
    /// following re-exports of the name that comes next.
    fn target(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let module = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| self.modules.contains(p))
                .unwrap_or_default();
            let Some(next) = path.get(module.len()) else {
                return module;
            };
            match self.reexports.get(&(module.clone(), next.clone())) {
                Some(to) => {
                    let mut followed = to.clone();
                    followed.extend_from_slice(&path[module.len() + 1..]);
                    path = followed;
                }
                None => return module,
            }
        }
        Vec::new()
    }

    fn add_arrow(&mut self, u: &Use) {
        let target = self.target(&u.path);
        let common = u
            .module
            .iter()
            .zip(&target)
            .take_while(|(a, b)| a == b)
            .count();
        // An ancestor naming a descendant, or the other way round, is no
        // arrow between siblings.
        let (Some(from), Some(to)) = (u.module.get(common), target.get(common)) else {
            return;
        };
        self.arrows
            .entry(u.module[..common].to_vec())
            .or_default()
            .entry((from.clone(), to.clone()))
            .or_insert_with(|| u.place.clone());
    }

    fn arrow_count(&self) -> usize {
        self.arrows.values().map(BTreeMap::len).sum()
    }

    /// Each cycle among siblings, one line a cycle: the parent, the loop,
    /// and where each of its arrows is drawn.
    fn cycles(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (parent, arrows) in &self.arrows {
            let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for (from, to) in arrows.keys() {
                next.entry(from).or_default().insert(to);
            }
            for component in strongly_connected(&next) {
                let first = component[0];
                let cycle = shortest_loop(&next, first, &component);
                let mut line = format!(
                    "crate{}: {}",
                    parent.iter().map(|p| format!("::{p}")).collect::<String>(),
                    cycle.join(" -> ")
                );
                line.push_str(&format!(
                    " (all of {{{}}} is one knot)\n",
                    component.join(", ")
                ));
                for pair in cycle.windows(2) {
                    let place = &arrows[&(pair[0].to_string(), pair[1].to_string())];
                    line.push_str(&format!("    {} -> {}: {place}\n", pair[0], pair[1]));
                }
                out.push(line);
            }
        }
        out
    }
}

/// Tarjan's strongly connected components with more than one module,
/// each sorted, in order of their first module.
fn strongly_connected<'a>(next: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct Walk<'a, 'g> {
        next: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<&'a str>>,
    }
    impl<'a> Walk<'a, '_> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in self.next.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort_unstable();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &v in next.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// The shortest loop from `start` back to it inside `component`
/// (breadth first), `start` at both ends.
fn shortest_loop<'a>(
    next: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    start: &'a str,
    component: &[&'a str],
) -> Vec<&'a str> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in next.get(v).into_iter().flatten() {
            if !component.contains(&w) {
                continue;
            }
            if w == start {
                let mut cycle = vec![start, v];
                let mut at = v;
                while at != start {
                    at = came_from[at];
                    cycle.push(at);
                }
                cycle.reverse();
                return cycle;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    vec![start]
}

/// `crate::`, `super::` and `self::` paths written in an item's code (not
/// in its visibility), with their lines, and the functions longer than
/// the limit; test-only items left out.
#[derive(Default)]
struct Paths {
    found: Vec<(Vec<String>, usize)>,
    /// Name, line and length of each function over the limit.
    long_functions: Vec<(String, usize, usize)>,
}

impl Paths {
    fn measure(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let first = sig.fn_token.span.start().line;
        let lines = block.brace_token.span.close().start().line + 1 - first;
        if lines > MAX_FUNCTION_LINES {
            self.long_functions
                .push((sig.ident.to_string(), first, lines));
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if matches!(
            segments.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) {
            let line = path.segments[0].ident.span().start().line;
            self.found.push((segments, line));
        }
        syn::visit::visit_path(self, path);
    }
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            self.measure(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.measure(&f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }
}

/// Every path a `use` tree names, with the name it is bound to.
fn flatten(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                let alias = prefix.last().cloned();
                out.push((prefix, alias));
            } else {
                let mut path = prefix;
                path.push(name.clone());
                out.push((path, Some(name)));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix;
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix, None)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                flatten(tree, prefix.clone(), out);
            }
        }
    }
}

/// `path` from the crate root, when it starts at `crate`, `super` or `self`.
fn resolve(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut at = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "super" | "self" => module.to_vec(),
        _ => return None,
    };
    let mut rest = path;
    if rest[0] == "crate" {
        rest = &rest[1..];
    }
    while let Some(first) = rest.first() {
        match first.as_str() {
            "super" => {
                at.pop()?;
            }
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    at.extend_from_slice(rest);
    Some(at)
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]`: compiled only into the crate's own tests.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// Every source file `docs/architecture.md` names (a `…​.rs` in backticks,
/// given whole or by its last parts, as `epoch/read.rs`) exists.
#[test]
fn every_file_the_architecture_page_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the page");
    let mut files = Vec::new();
    for dir in [
        "engine",
        "kafka-sink",
        "sql",
        "nexmark",
        "jdbc",
        "status",
        "src",
        "tests",
        "benches",
    ] {
        collect_rs(&root.join(dir), &mut files);
    }
    let files: Vec<String> = files
        .iter()
        .filter_map(|f| f.strip_prefix(root).ok())
        .map(|f| format!("/{}", f.display()))
        .collect();
    let named: BTreeSet<&str> = page
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.ends_with(".rs") && !t.contains(' '))
        .collect();
    assert!(named.len() > 20, "the page names its files: {named:?}");
    let missing: Vec<&&str> = named
        .iter()
        .filter(|name| !files.iter().any(|f| f.ends_with(&format!("/{name}"))))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files that do not exist: {missing:?}"
    );
}

fn collect_rs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !path.ends_with("target") && !path.ends_with("fixtures") {
                collect_rs(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
