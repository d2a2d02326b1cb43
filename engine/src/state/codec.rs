//! The one byte format of checkpoint files and of the state in them.
//!
//! **Framing.** Every checkpoint file (metadata, `offsets/N`, `commits/N`,
//! state snapshots and deltas) is a header line — magic, format version,
//! CRC-32 and length of the payload, fixed width — then the payload. A file
//! whose header, length or checksum does not match is reported by name,
//! never read as something else. [`Framed`] writes a payload streamed
//! behind its header; [`unframe`] checks and strips it.
//!
//! **Payloads.** State is Arrow IPC files, composed in parts:
//! - [`two_parts`]: the first part's length (8 bytes, little endian), the
//!   first part, the second. A keyed state's delta is (upserted rows,
//!   removed keys); a join's snapshot is (left buffer, right buffer).
//! - [`JoinDelta`]: an eviction (or TTL) header, then ((appended left,
//!   appended right), matched left row ids).
//! - [`write_part`]/[`split_parts`]: a multi-operator pipeline's state, a
//!   part per operator, each with an optional tag byte (unchanged, delta,
//!   snapshot) and a length (8 bytes, little endian).
//!
//! Every layout here is read by the releases after the one that wrote it:
//! `tests/fixtures/checkpoints-*` keeps checkpoints of earlier releases
//! that the integration tests restore.

use std::fs;
use std::io::{Seek, Write};
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::{read_footer_length, FileDecoder};
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::ipc::{root_as_footer, Block};

use super::columns::compact_views_to_write;
use super::remote;
use crate::error::{Result, SluiceError};

/// Version of the checkpoint layout this engine writes and reads.
pub const FORMAT_VERSION: u32 = 1;

pub(crate) const MAGIC: &str = "SLUICE-CHECKPOINT";

/// The header line: magic, format version, CRC-32 and length of the
/// payload. Fixed width, so it can be written before the payload is known
/// and rewritten in place after it.
pub(crate) fn header(crc: u32, len: u64) -> String {
    format!("{MAGIC} {FORMAT_VERSION} {crc:08x} {len:020}\n")
}

/// Counts and checksums a payload on its way to `inner`; its
/// [`header`](Framed::header) is then written over the placeholder the
/// file starts with.
pub(crate) struct Framed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Framed<W> {
    /// Writes a placeholder header to `inner`; the payload follows.
    pub(crate) fn start(mut inner: W) -> std::io::Result<Self> {
        inner.write_all(header(0, 0).as_bytes())?;
        Ok(Self {
            inner,
            crc: crc32fast::Hasher::new(),
            len: 0,
        })
    }

    /// The writer and the header of what went through.
    pub(crate) fn finish(self) -> (W, String) {
        let header = header(self.crc.finalize(), self.len);
        (self.inner, header)
    }
}

impl<W: Write> Write for Framed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What to do about a checkpoint file that is missing or does not read,
/// after the reason.
pub(crate) const DAMAGED: &str = "the checkpoint is damaged. Restore the file from a backup, or \
     start the query on a new checkpoint location (it will reprocess from the start)";

/// The payload of a file's `bytes` (read from `path`, named in errors),
/// after checking its header, length and checksum.
pub(crate) fn unframe<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a [u8]> {
    let corrupt = |reason: String| SluiceError::checkpoint(path, format!("{reason}; {DAMAGED}"));
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| corrupt("missing header line".into()))?;
    let header =
        std::str::from_utf8(&bytes[..newline]).map_err(|_| corrupt("header is not text".into()))?;
    let parts: Vec<&str> = header.split(' ').collect();
    let [magic, version, crc, len] = parts[..] else {
        return Err(corrupt(format!("malformed header '{header}'")));
    };
    if magic != MAGIC {
        return Err(corrupt(format!(
            "not a Sluice checkpoint file (header '{header}')"
        )));
    }
    if version != FORMAT_VERSION.to_string() {
        return Err(SluiceError::checkpoint(
            path,
            format!(
                "written by checkpoint format version {version}, this engine reads version \
                 {FORMAT_VERSION}; use the engine version that wrote it or a new checkpoint location"
            ),
        ));
    }
    let payload = &bytes[newline + 1..];
    let len: usize = len
        .parse()
        .map_err(|_| corrupt(format!("malformed length in header '{header}'")))?;
    if payload.len() != len {
        return Err(corrupt(format!(
            "truncated or extended: header says {len} bytes, file has {}",
            payload.len()
        )));
    }
    let crc = u32::from_str_radix(crc, 16)
        .map_err(|_| corrupt(format!("malformed checksum in header '{header}'")))?;
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(payload)
}

/// Writes `path` atomically (temporary file, fsync, rename, fsync of the
/// directory) with a payload `write` produces, streamed: a large state
/// snapshot never has to be held in memory whole.
pub(crate) fn write_framed(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    write_framed_as(path, Durability::Synced, write)
}

/// How a local file is written: both ways are atomic for a process crash
/// (temporary file, rename); only `Synced` also survives the machine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsync of the file before the rename and of the directory after.
    Synced,
    /// No fsync: the page cache outlives the process (`kill -9`), not an
    /// operating-system crash, after which the file may be missing,
    /// empty or torn (its checksum then says so).
    PageCache,
}

/// [`write_framed`] with a choice of [`Durability`] (object storage is
/// durable either way).
pub(crate) fn write_framed_as(
    path: &Path,
    durability: Durability,
    write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    if let Some(object) = remote::of(path)? {
        let io = |e| SluiceError::io(format!("writing {}", path.display()), e);
        let mut body = Framed::start(Vec::new()).map_err(io)?;
        write(&mut body).map_err(io)?;
        let (mut bytes, header) = body.finish();
        bytes[..header.len()].copy_from_slice(header.as_bytes());
        return object.put(bytes);
    }
    let dir = path
        .parent()
        .ok_or_else(|| SluiceError::Internal(format!("{} has no parent", path.display())))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{file_name}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let io = |e| SluiceError::io(format!("writing {}", tmp.display()), e);
    let f = fs::File::create(&tmp).map_err(io)?;
    let mut body = Framed::start(std::io::BufWriter::with_capacity(1 << 20, f)).map_err(io)?;
    write(&mut body).map_err(io)?;
    body.flush().map_err(io)?;
    let (inner, header) = body.finish();
    let mut f = inner.into_inner().map_err(|e| io(e.into_error()))?;
    f.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
    f.write_all(header.as_bytes()).map_err(io)?;
    if durability == Durability::Synced {
        f.sync_all().map_err(io)?;
    }
    drop(f);
    fs::rename(&tmp, path).map_err(|e| {
        SluiceError::io(
            format!("renaming {} to {}", tmp.display(), path.display()),
            e,
        )
    })?;
    // The rename is durable only once the directory entry is.
    if durability == Durability::Synced {
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Creates directory `path` and any missing parents, each made durable in
/// its parent (fsync of the parent once the entry exists): a crash right
/// after cannot lose a directory that files already committed live in.
pub(crate) fn create_dirs(path: &Path) -> Result<()> {
    // An object store has no directories: a path exists with its objects.
    if path.is_dir() || remote::is_remote(path) {
        return Ok(());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs(parent)?;
    }
    match fs::create_dir(path) {
        Ok(()) => {}
        // Made meanwhile by someone else: fine, it exists.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(SluiceError::io(format!("creating {}", path.display()), e)),
    }
    if let Some(parent) = path.parent() {
        if let Ok(d) = fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Removes `path`; a file already gone is fine (an earlier purge, cut
/// short, removed it).
pub(crate) fn remove_file(path: &Path) -> Result<()> {
    if let Some(object) = remote::of(path)? {
        return object.delete();
    }
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(SluiceError::io(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// How old a temporary file must be to count as left by an interrupted
/// write. A younger one may be another process's write in flight: the
/// processes of a task group open the query's shared folders at once, and
/// a task's next owner opens its folder while the last may still write.
const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes from `dir` the temporary files of writes a crash interrupted
/// (`.<name>.<id>.tmp`, see [`write_framed`], older than
/// [`LEFTOVER_AGE`]): never part of a checkpoint.
pub(crate) fn remove_leftovers(dir: &Path) -> Result<()> {
    // Puts to an object store are atomic: nothing is left half written.
    if remote::is_remote(dir) {
        return Ok(());
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if name.starts_with('.')
            && name.ends_with(".tmp")
            && age.is_some_and(|age| age >= LEFTOVER_AGE)
        {
            remove_file(&entry.path())?;
        }
    }
    Ok(())
}

/// The payload of the file at `path`, after checking its frame (see
/// [`unframe`]).
pub(crate) fn read_framed(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = match remote::of(path)? {
        Some(object) => object.get()?,
        None => {
            fs::read(path).map_err(|e| SluiceError::io(format!("reading {}", path.display()), e))?
        }
    };
    let header = bytes.len() - unframe(path, &bytes)?.len();
    // In place: a copy of a large snapshot would hold it twice.
    bytes.drain(..header);
    Ok(bytes)
}

/// The names in directory `dir` (on an object store: under the prefix),
/// sorted; empty when there is no such directory.
pub(crate) fn list_dir(dir: &Path) -> Result<Vec<String>> {
    if let Some(prefix) = remote::of(dir)? {
        return prefix.list();
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SluiceError::io(format!("listing {}", dir.display()), e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// The size of the file at `path`, or `None` when there is none.
pub(crate) fn file_len(path: &Path) -> Result<Option<u64>> {
    if let Some(object) = remote::of(path)? {
        return object.len();
    }
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SluiceError::io(format!("reading {}", path.display()), e)),
    }
}

/// Two byte strings as one: the first's length (8 bytes, little endian),
/// the first, the second.
pub(crate) fn two_parts(first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + first.len() + second.len());
    // Copying into a Vec cannot fail.
    let _ = two_parts_with(
        &mut out,
        |o| {
            o.extend_from_slice(first);
            Ok(())
        },
        |o| {
            o.extend_from_slice(second);
            Ok(())
        },
    );
    out
}

/// [`two_parts`] of what `first` and `second` write, written into `out`
/// in place: a large part is not held twice.
pub(crate) fn two_parts_with(
    out: &mut Vec<u8>,
    first: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    second: impl FnOnce(&mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let at = out.len();
    out.extend_from_slice(&[0; 8]);
    first(out)?;
    let len = (out.len() - at - 8) as u64;
    out[at..at + 8].copy_from_slice(&len.to_le_bytes());
    second(out)
}

/// The two parts of [`two_parts`]' bytes (`what`, named in errors).
pub(crate) fn split_two_parts<'a>(bytes: &'a [u8], what: &str) -> Result<(&'a [u8], &'a [u8])> {
    let damaged = || SluiceError::Internal(format!("{what} is truncated"));
    let len = bytes.get(..8).ok_or_else(damaged)?;
    let len = usize::try_from(u64::from_le_bytes(len.try_into().map_err(|_| damaged())?))
        .map_err(|_| damaged())?;
    // A damaged length may be any u64 (found by `state::fuzz`).
    let end = len.checked_add(8).ok_or_else(damaged)?;
    let first = bytes.get(8..end).ok_or_else(damaged)?;
    let second = bytes.get(end..).ok_or_else(damaged)?;
    Ok((first, second))
}

/// `batch` as Arrow IPC file bytes.
pub(crate) fn ipc_bytes(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_ipc(&mut out, batch)?;
    Ok(out)
}

/// Writes `batch` into `w` as an Arrow IPC file, streamed, in slices of
/// [`IPC_SLICE_ROWS`] rows: the IPC writer encodes each batch it is given
/// into one buffer before writing it, so a 10 M-row state written whole
/// would first be copied whole.
pub(crate) fn write_ipc(w: &mut dyn Write, batch: &RecordBatch) -> Result<()> {
    write_ipc_slices(w, batch, |slice, _| Ok(slice))
}

/// Whether `bytes` are an Arrow IPC file (by its magic), as a snapshot
/// is, rather than a delta's two parts (whose first 8 bytes are a length).
pub(crate) fn is_ipc_file(bytes: &[u8]) -> bool {
    bytes.starts_with(b"ARROW1")
}

/// [`write_ipc`] of what `select` keeps of each slice of `batch` (given
/// with its first row's position): the kept rows are never all in memory
/// at once.
pub(crate) fn write_ipc_slices(
    w: &mut dyn Write,
    batch: &RecordBatch,
    select: impl Fn(RecordBatch, usize) -> Result<RecordBatch>,
) -> Result<()> {
    let mut writer = FileWriter::try_new(w, &batch.schema())?;
    for start in (0..batch.num_rows()).step_by(IPC_SLICE_ROWS) {
        let slice = batch.slice(start, IPC_SLICE_ROWS.min(batch.num_rows() - start));
        let kept = select(slice, start)?;
        if kept.num_rows() > 0 {
            writer.write(&compact_views_to_write(kept)?)?;
        }
    }
    writer.finish()?;
    Ok(())
}

/// [`write_ipc`] of `parts`, batches of `schema` given one at a time
/// (rows read back from disk): none is held longer than its writing.
pub(crate) fn write_ipc_parts(
    w: &mut dyn Write,
    schema: &SchemaRef,
    parts: impl Iterator<Item = Result<RecordBatch>>,
) -> Result<()> {
    let mut writer = FileWriter::try_new(w, schema)?;
    for part in parts {
        let part = part?;
        for start in (0..part.num_rows()).step_by(IPC_SLICE_ROWS) {
            let slice = part.slice(start, IPC_SLICE_ROWS.min(part.num_rows() - start));
            writer.write(&compact_views_to_write(slice)?)?;
        }
    }
    writer.finish()?;
    Ok(())
}

/// Rows per IPC batch of a state file: about 1.5 MB of a BIGINT key and
/// two accumulators, large enough that per-batch framing is noise.
const IPC_SLICE_ROWS: usize = 1 << 16;

/// Arrow IPC file bytes as one batch of `schema` (the stored schema may
/// differ in field metadata from the current plan's; the columns match).
///
/// Read as [`read_ipc_owned`] reads: arrow's `FileReader` allocates what
/// a damaged block's length says (a file whose checksum matches, found by
/// `state::fuzz`: 120 TB, and the process aborts), where the footer's
/// blocks are checked against the file here first.
pub(crate) fn read_ipc(bytes: &[u8], schema: &SchemaRef) -> Result<RecordBatch> {
    read_ipc_owned(bytes.to_vec(), schema)
}

/// Arrow's IPC reader, given bytes that pass the file's checksum but are
/// not what Sluice wrote (a bug, a file made by hand), can panic instead
/// of failing (a buffer sliced past its end, found by `state::fuzz`):
/// that is a damaged file too, and an error.
fn guarded<T>(read: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| {
        Err(ArrowError::IpcError("an Arrow IPC file that does not read".into()).into())
    })
}

/// [`read_ipc`] of bytes it may keep: the batches are decoded in place
/// (arrays point into `bytes`) and then concatenated, so a large state is
/// held twice while it is restored, not three times (file, decoded
/// batches, concatenation).
pub(crate) fn read_ipc_owned(bytes: Vec<u8>, schema: &SchemaRef) -> Result<RecordBatch> {
    guarded(|| read_ipc_owned_unguarded(bytes, schema))
}

fn read_ipc_owned_unguarded(bytes: Vec<u8>, schema: &SchemaRef) -> Result<RecordBatch> {
    let buffer = Buffer::from_vec(bytes);
    let damaged = |what: &str| ArrowError::IpcError(format!("{what} of an Arrow IPC file"));
    let trailer_start = buffer
        .len()
        .checked_sub(10)
        .ok_or_else(|| damaged("too short to be the footer"))?;
    let trailer: [u8; 10] = buffer[trailer_start..]
        .try_into()
        .map_err(|_| damaged("no trailer"))?;
    let footer_len = read_footer_length(trailer)?;
    let footer_start = trailer_start
        .checked_sub(footer_len)
        .ok_or_else(|| damaged("a footer longer than the file"))?;
    let footer = root_as_footer(&buffer[footer_start..trailer_start])
        .map_err(|e| ArrowError::IpcError(format!("unreadable footer: {e}")))?;
    let mut decoder = FileDecoder::new(Arc::clone(schema), footer.version());
    let block_bytes = |block: &Block| -> std::result::Result<Buffer, ArrowError> {
        let start = usize::try_from(block.offset()).map_err(|_| damaged("a negative block"))?;
        let len = block.metaDataLength() as usize + block.bodyLength() as usize;
        if start.checked_add(len).is_none_or(|end| end > footer_start) {
            return Err(damaged("a block outside"));
        }
        Ok(buffer.slice_with_length(start, len))
    };
    for block in footer.dictionaries().iter().flatten() {
        decoder.read_dictionary(block, &block_bytes(block)?)?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().iter().flatten() {
        if let Some(batch) = decoder.read_record_batch(block, &block_bytes(block)?)? {
            batches.push(batch);
        }
    }
    Ok(concat_batches(schema, &batches)?)
}

/// One epoch's changes to a join's buffers.
#[derive(Debug)]
pub(crate) struct JoinDelta {
    /// The eviction's expiries (left, right, ns), if the epoch evicted.
    pub evicted: Option<(i64, i64)>,
    /// Under `state.ttl` (an unbounded join, which never evicts): rows
    /// written before the first time (ms) expired, then the appended rows
    /// were written at the second.
    pub written: Option<(i64, i64)>,
    /// Rows appended to the left buffer (with their ids and flags).
    pub left: RecordBatch,
    /// Rows appended to the right buffer.
    pub right: RecordBatch,
    /// Ids of the left rows newly matched.
    pub matched: Vec<u64>,
}

/// Bytes before the parts of a join delta: whether it evicts (1 byte:
/// 1), or expires by a TTL (2), then the two times (8 bytes each, little
/// endian): the left and right expiries, or the TTL's expiry and the
/// appended rows' time.
const JOIN_DELTA_HEADER: usize = 17;

impl JoinDelta {
    /// The delta's bytes: the header, then ((left, right), matched ids),
    /// each Arrow IPC, composed with [`two_parts`].
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let ids = RecordBatch::try_new(
            id_schema(),
            vec![Arc::new(UInt64Array::from(self.matched.clone()))],
        )?;
        let (flag, (l, r)) = match (self.evicted, self.written) {
            (Some(limits), _) => (1u8, limits),
            (None, Some(times)) => (2, times),
            (None, None) => (0, (0, 0)),
        };
        let mut out = Vec::new();
        out.push(flag);
        out.extend_from_slice(&l.to_le_bytes());
        out.extend_from_slice(&r.to_le_bytes());
        out.extend(two_parts(
            &two_parts(&ipc_bytes(&self.left)?, &ipc_bytes(&self.right)?),
            &ipc_bytes(&ids)?,
        ));
        Ok(out)
    }

    /// A delta [`encode`](Self::encode) wrote, its sides read with these
    /// schemas.
    pub(crate) fn decode(bytes: &[u8], left: &SchemaRef, right: &SchemaRef) -> Result<Self> {
        let damaged = || SluiceError::Internal("the join delta is truncated".into());
        let (header, parts) = bytes
            .split_at_checked(JOIN_DELTA_HEADER)
            .ok_or_else(damaged)?;
        let limit = |at: usize| {
            header[at..at + 8]
                .try_into()
                .map(i64::from_le_bytes)
                .map_err(|_| damaged())
        };
        let (evicted, written) = match header[0] {
            0 => (None, None),
            1 => (Some((limit(1)?, limit(9)?)), None),
            2 => (None, Some((limit(1)?, limit(9)?))),
            other => {
                return Err(SluiceError::Internal(format!(
                    "the join delta has an unknown eviction flag {other}"
                )))
            }
        };
        let (sides, ids) = split_two_parts(parts, "the join delta")?;
        let (new_left, new_right) = split_two_parts(sides, "the join delta")?;
        let ids = read_ipc(ids, &id_schema())?;
        Ok(Self {
            evicted,
            written,
            left: read_ipc(new_left, left)?,
            right: read_ipc(new_right, right)?,
            matched: ids.column(0).as_primitive::<UInt64Type>().values().to_vec(),
        })
    }
}

/// The schema of a join delta's matched ids.
fn id_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::UInt64, false)]))
}

/// How a pipeline delta carries one operator's part.
pub(crate) const PART_UNCHANGED: u8 = 0;
pub(crate) const PART_DELTA: u8 = 1;
pub(crate) const PART_SNAPSHOT: u8 = 2;

/// Writes one part of a pipeline's state file, as [`split_parts`] reads
/// it: the tag byte if any, the length (8 bytes, little endian), the bytes.
pub(crate) fn write_part(
    w: &mut dyn std::io::Write,
    tag: Option<u8>,
    bytes: &[u8],
) -> std::io::Result<()> {
    if let Some(tag) = tag {
        w.write_all(&[tag])?;
    }
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)
}

/// `n` parts of a pipeline's state file (`what`): each a tag byte if
/// `tagged`, a length (8 bytes, little endian), then that many bytes.
pub(crate) fn split_parts<'a>(
    mut bytes: &'a [u8],
    n: usize,
    tagged: bool,
    what: &str,
) -> Result<Vec<(u8, &'a [u8])>> {
    let damaged = || SluiceError::Internal(format!("the pipeline's state {what} is truncated"));
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut tag = 0;
        if tagged {
            let (&t, rest) = bytes.split_first().ok_or_else(damaged)?;
            (tag, bytes) = (t, rest);
        }
        let (len, rest) = bytes.split_first_chunk::<8>().ok_or_else(damaged)?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| damaged())?;
        if rest.len() < len {
            return Err(damaged());
        }
        let (part, rest) = rest.split_at(len);
        out.push((tag, part));
        bytes = rest;
    }
    if !bytes.is_empty() {
        return Err(SluiceError::Internal(format!(
            "the pipeline's state {what} has more parts than the query has operators"
        )));
    }
    if tagged {
        if let Some((tag, _)) = out.iter().find(|(tag, _)| *tag > PART_SNAPSHOT) {
            return Err(SluiceError::Internal(format!(
                "the pipeline's state {what} has a part of unknown kind {tag}"
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slice_of_a_state_file_carries_only_its_own_strings() {
        use datafusion::arrow::array::StringViewArray;
        let rows = 4 * IPC_SLICE_ROWS;
        let values: Vec<String> = (0..rows).map(|i| format!("{i:0>40}")).collect();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(StringViewArray::from_iter_values(values.iter()))],
        )
        .unwrap();
        let bytes = ipc_bytes(&batch).unwrap();
        // 40 bytes of string and a 16-byte view per row: the slices,
        // written whole, would each carry all four slices' strings.
        assert!(
            bytes.len() < rows * 60,
            "{} bytes for {rows} rows",
            bytes.len()
        );
        assert_eq!(read_ipc(&bytes, &schema).unwrap(), batch);
    }

    #[test]
    fn a_frame_round_trips_and_a_flipped_byte_is_caught() {
        let mut framed = Framed::start(Vec::new()).unwrap();
        framed.write_all(b"payload").unwrap();
        let (mut bytes, header) = framed.finish();
        bytes[..header.len()].copy_from_slice(header.as_bytes());
        let path = Path::new("state/x/1.r.delta");
        assert_eq!(unframe(path, &bytes).unwrap(), b"payload");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let e = unframe(path, &bytes).unwrap_err().to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains("1.r.delta"),
            "{e}"
        );
    }

    #[test]
    fn pipeline_parts_round_trip_and_unknown_tags_are_refused() {
        let mut bytes = Vec::new();
        write_part(&mut bytes, Some(PART_DELTA), b"ab").unwrap();
        write_part(&mut bytes, Some(PART_UNCHANGED), b"").unwrap();
        let parts = split_parts(&bytes, 2, true, "delta").unwrap();
        assert_eq!(
            parts,
            vec![(PART_DELTA, &b"ab"[..]), (PART_UNCHANGED, &b""[..])]
        );
        assert!(split_parts(&bytes, 1, true, "delta").is_err());
        bytes[0] = 9;
        assert!(split_parts(&bytes, 2, true, "delta").is_err());
    }
}
