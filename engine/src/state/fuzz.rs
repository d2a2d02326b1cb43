//! The fuzz target for the checkpoint file reader: the checkpoints of an
//! earlier release kept in `tests/fixtures/checkpoints-*`, one file at a
//! time damaged at random (bytes flipped, cut, repeated, dropped in), or
//! its payload damaged and framed again with a valid checksum so that the
//! readers behind the frame see it, then read back as recovery reads it:
//! `metadata` by opening the checkpoint, `offsets/N` and `commits/N` as
//! records, state files through their framing, parts, halves and Arrow
//! IPC.
//!
//! What must hold: nothing panics, and a file that does not read is named
//! in the error (never silently read as something else).
//!
//! The damaged files a run once found a reader failing on are kept in
//! `tests/fixtures/fuzz-checkpoint/<query>/<path>` (see its README) and
//! read back first, every run.
//!
//! CI runs a fixed seed and `SLUICE_FUZZ_CASES` cases (default 300); ten
//! minutes: `SLUICE_FUZZ_SECONDS=600 cargo test -p sluice-engine --lib state::fuzz -- --nocapture`.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::ipc::reader::FileReader;

use super::codec::{
    header, read_framed, read_ipc, read_ipc_owned, split_parts, split_two_parts, JoinDelta,
};
use crate::checkpoint::Checkpoint;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes a mutation drops in: framing, JSON and IPC pieces, lengths at
/// their limits.
const PIECES: &[&[u8]] = &[
    b"SLUICE-CHECKPOINT 1 ",
    b"\n",
    b" ",
    b"{",
    b"}",
    b"\"",
    b"-1",
    b"18446744073709551615",
    b"ARROW1",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00\x00\x00\x00\x00",
    b"\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x02",
];

fn mutate(rng: &mut Rng, bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => out.truncate(at),
            2 => {
                let piece = PIECES[rng.below(PIECES.len())];
                out.splice(at..at, piece.iter().copied());
            }
            3 if !out.is_empty() => {
                let from = rng.below(out.len());
                let to = (from + 1 + rng.below(64)).min(out.len());
                let copy = out[from..to].to_vec();
                out.splice(at..at, copy);
            }
            4 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            _ => {
                let end = (at + rng.below(32)).min(out.len());
                out.drain(at..end);
            }
        }
    }
    out
}

/// `payload` framed as a checkpoint file, with its true checksum.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(payload);
    let mut out = header(crc.finalize(), payload.len() as u64).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path, under: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, under, out);
        } else if let Ok(relative) = path.strip_prefix(under) {
            out.push(relative.to_path_buf());
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let mut all = Vec::new();
    files(from, from, &mut all);
    for relative in all {
        let target = to.join(&relative);
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("a directory");
        std::fs::copy(from.join(&relative), target).expect("a copy");
    }
}

/// The readers behind a state file's frame, each tried on `payload`: its
/// parts (tagged or not), their halves, the Arrow IPC files in them read
/// with the schema each file declares, and a join delta.
fn read_state(payload: &[u8]) {
    let mut pieces: Vec<&[u8]> = vec![payload];
    for n in 1..=3 {
        for tagged in [true, false] {
            if let Ok(parts) = split_parts(payload, n, tagged, "fuzz") {
                pieces.extend(parts.into_iter().map(|(_, p)| p));
            }
        }
    }
    let mut halves = Vec::new();
    for piece in &pieces {
        if let Ok((a, b)) = split_two_parts(piece, "fuzz") {
            halves.extend([a, b]);
            if let Ok((c, d)) = split_two_parts(a, "fuzz") {
                halves.extend([c, d]);
            }
        }
    }
    pieces.extend(halves);
    let mut schemas = Vec::new();
    for piece in &pieces {
        // The schema a piece declares, as the operator would know it (arrow
        // may panic on a damaged footer: `read_ipc` guards against that).
        let declared = std::panic::catch_unwind(|| {
            FileReader::try_new(Cursor::new(*piece), None).map(|r| r.schema())
        });
        if let Ok(Ok(schema)) = declared {
            let _ = read_ipc(piece, &schema);
            let _ = read_ipc_owned(piece.to_vec(), &schema);
            schemas.push(schema);
        }
    }
    let empty = Arc::new(datafusion::arrow::datatypes::Schema::empty());
    let left = schemas
        .first()
        .cloned()
        .unwrap_or_else(|| Arc::clone(&empty));
    let right = schemas.get(1).cloned().unwrap_or(empty);
    for piece in &pieces {
        let _ = JoinDelta::decode(piece, &left, &right);
    }
}

/// Reads `relative` of the checkpoint at `dir` as recovery would; an
/// error must name it.
fn read_back(dir: &Path, relative: &Path) {
    let name = relative.to_string_lossy().to_string();
    let named = |e: crate::error::SluiceError| {
        let said = e.to_string();
        assert!(
            said.contains(&name),
            "an error that does not name '{name}': {said}"
        );
    };
    let epoch = || relative.file_name()?.to_str()?.parse::<u64>().ok();
    match (relative.parent().and_then(Path::to_str), epoch()) {
        (Some(""), _) if name == "metadata" => {
            if let Err(e) = Checkpoint::open_existing(dir) {
                named(e);
            }
        }
        (Some(kind @ ("offsets" | "commits")), Some(epoch)) => {
            let checkpoint = match Checkpoint::open_existing(dir) {
                Ok(c) => c,
                Err(e) => panic!("the undamaged metadata does not open: {e}"),
            };
            let read = match kind {
                "offsets" => checkpoint.read_offsets(epoch).map(|_| ()),
                _ => checkpoint.read_commit(epoch).map(|_| ()),
            };
            if let Err(e) = read {
                named(e);
            }
        }
        _ => match read_framed(&dir.join(relative)) {
            Ok(payload) => read_state(&payload),
            Err(e) => named(e),
        },
    }
}

#[test]
fn no_damaged_checkpoint_file_makes_recovery_panic_or_go_unnamed() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("SLUICE_FUZZ_CASES").unwrap_or(300);
    let seconds = env("SLUICE_FUZZ_SECONDS");
    let seed = env("SLUICE_FUZZ_SEED").unwrap_or(0x5eed);
    let fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/checkpoints-0.1.0");
    let mut queries: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .expect("the checkpoint fixtures")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("metadata").exists())
        .collect();
    queries.sort();
    let dir = tempfile::tempdir().expect("a directory");
    let mut targets = Vec::new();
    for query in &queries {
        let copy = dir.path().join(query.file_name().expect("a name"));
        copy_dir(query, &copy);
        let mut all = Vec::new();
        files(&copy, &copy, &mut all);
        all.sort();
        targets.extend(all.into_iter().map(|f| (copy.clone(), f)));
    }
    assert!(targets.len() > 50, "{} fixture files", targets.len());
    let found = fixtures.join("../fuzz-checkpoint");
    let mut kept = Vec::new();
    files(&found, &found, &mut kept);
    for seed in kept
        .iter()
        .filter(|f| f.extension().is_none_or(|e| e != "md"))
    {
        let mut parts = seed.components();
        let query = dir.path().join(parts.next().expect("a query"));
        let relative = parts.as_path();
        let path = query.join(relative);
        let original = std::fs::read(&path).expect("the fixture file it damages");
        std::fs::copy(found.join(seed), &path).expect("the kept file");
        read_back(&query, relative);
        std::fs::write(&path, &original).expect("the file restored");
    }
    assert!(kept.len() >= 4, "the kept files: {kept:?}");
    let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    let started = Instant::now();
    let mut n = 0u64;
    loop {
        let done = match seconds {
            Some(s) => started.elapsed() >= Duration::from_secs(s),
            None => n >= cases,
        };
        if done {
            break;
        }
        let (query, relative) = &targets[rng.below(targets.len())];
        let path = query.join(relative);
        let original = std::fs::read(&path).expect("a fixture file");
        let newline = original.iter().position(|b| *b == b'\n').unwrap_or(0);
        let damaged = match rng.below(2) {
            0 => mutate(&mut rng, &original),
            _ => framed(&mutate(&mut rng, &original[newline + 1..])),
        };
        std::fs::write(&path, &damaged).expect("a damaged file");
        // What an abort (not a panic: an allocation refused) leaves behind.
        let current = std::env::temp_dir().join("sluice-fuzz-checkpoint-current");
        let _ = std::fs::write(&current, format!("{}\n", relative.display()).as_bytes());
        let _ = std::fs::write(current.with_extension("bytes"), &damaged);
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_back(query, relative)));
        std::fs::write(&path, &original).expect("the file restored");
        if let Err(panic) = outcome {
            let kept = std::env::temp_dir().join(format!("sluice-fuzz-checkpoint-{n}"));
            let _ = std::fs::write(&kept, &damaged);
            eprintln!(
                "checkpoint fuzz (seed {seed}, case {n}): reading {} failed; the damaged file is \
                 at {}",
                relative.display(),
                kept.display()
            );
            std::panic::resume_unwind(panic);
        }
        n += 1;
    }
    if seconds.is_some() {
        eprintln!(
            "checkpoint fuzz: {n} cases in {:?}, seed {seed}",
            started.elapsed()
        );
    }
}
