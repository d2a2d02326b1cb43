//! The aggregation's hot path: an epoch's partial rows grouped by key in
//! one pass over the index ([`KeyedState::locate`]), and the merged rows
//! written back where it found their keys ([`KeyedState::upsert_located`]),
//! each key hashed once. Over a large state most of an epoch's time is
//! these probes, each a few cache misses, so a large probe's lookups run on
//! two threads: they only read the index.

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::keys::{KeyBytes, KeyRef, ProbeKeys};
use super::KeyedState;
use crate::error::{Result, SluiceError};
use crate::state::columns::Placement;

impl KeyedState {
    /// Groups the rows of `probe` by key in one pass over the index: the
    /// stored rows of the keys found, and for every probe row its group —
    /// the stored keys first, in the order met, then the new keys. What an
    /// aggregation needs to merge an epoch's partial states into the stored
    /// ones without hashing the keys again.
    pub(crate) fn locate(&self, probe: &[RecordBatch]) -> Result<Located> {
        const NEW: usize = 1 << (usize::BITS - 1);
        let encoded = probe
            .iter()
            .map(|b| self.keys_of(b))
            .collect::<Result<Vec<_>>>()?;
        let probed: usize = encoded.iter().map(|k| k.len()).sum();
        let found = self.probe_index(&encoded, probed)?;
        let mut stored_group = StoredGroups::new(self.rows.num_rows(), probed);
        let mut wanted: Vec<u32> = Vec::new();
        // New keys with their hashes, which the index will take.
        let mut new_index: HashTable<u32> = HashTable::new();
        let mut new_rows: Vec<(usize, usize)> = Vec::new();
        let mut new_hashes: Vec<u64> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::with_capacity(probe.len());
        for (b, keys) in encoded.iter().enumerate() {
            let mut of_batch = Vec::with_capacity(keys.len());
            for (r, &pos) in found[b].iter().enumerate() {
                let key = keys.get(r);
                let group = match (pos != NOT_STORED).then_some(pos) {
                    Some(pos) => stored_group.group_of(pos, || {
                        wanted.push(pos);
                        wanted.len() - 1
                    }),
                    None => {
                        // Hashed again rather than kept for every probe
                        // row: few are new once the state is large.
                        let hash = key.hash(&self.hasher);
                        let same = |&i: &u32| {
                            let (b2, r2) = new_rows[i as usize];
                            encoded[b2].get(r2) == key
                        };
                        let id = match new_index.find(hash, same) {
                            Some(&i) => i as usize,
                            None => {
                                new_rows.push((b, r));
                                new_hashes.push(hash);
                                // Groups number at most the probe's rows.
                                let id = new_rows.len() - 1;
                                new_index
                                    .insert_unique(hash, id as u32, |&i| new_hashes[i as usize]);
                                id
                            }
                        };
                        NEW | id
                    }
                };
                of_batch.push(group);
            }
            groups.push(of_batch);
        }
        // New keys follow the stored ones.
        let stored_count = wanted.len();
        for g in groups.iter_mut().flatten() {
            if *g & NEW != 0 {
                *g = stored_count + (*g & !NEW);
            }
        }
        let mut new_keys = KeyBytes::default();
        for &(b, r) in &new_rows {
            if let KeyRef::Bytes(bytes) = encoded[b].get(r) {
                new_keys.push(bytes);
            }
        }
        Ok(Located {
            stored: self.outer(take_record_batch(
                &self.rows,
                &UInt32Array::from(wanted.clone()),
            )?)?,
            positions: wanted,
            groups,
            new_rows,
            new_keys,
            new_hashes,
        })
    }

    /// Per row of each of `encoded` (`probed` rows in all), its key's
    /// stored position ([`NOT_STORED`] if none). The lookups are the
    /// bulk of an epoch over a large state (each misses the cache several
    /// times) and only read it, so a large probe is split across two
    /// threads.
    fn probe_index(&self, encoded: &[ProbeKeys], probed: usize) -> Result<Vec<Vec<u32>>> {
        let stored = self.view();
        let lookup = |keys: &ProbeKeys, rows: std::ops::Range<usize>| -> Vec<u32> {
            rows.map(|r| {
                let key = keys.get(r);
                let hash = key.hash(&self.hasher);
                self.find(&stored, hash, key).unwrap_or(NOT_STORED)
            })
            .collect()
        };
        let half = |second: bool| -> Vec<Vec<u32>> {
            encoded
                .iter()
                .map(|keys| {
                    let (n, mid) = (keys.len(), keys.len() / 2);
                    lookup(keys, if second { mid..n } else { 0..mid })
                })
                .collect()
        };
        if probed < PARALLEL_PROBE || cores() < 2 {
            return Ok(encoded.iter().map(|k| lookup(k, 0..k.len())).collect());
        }
        let (mut first, second) = std::thread::scope(|scope| {
            let second = scope.spawn(|| half(true));
            (half(false), second.join())
        });
        let second =
            second.map_err(|_| SluiceError::Internal("a state lookup thread panicked".into()))?;
        for (f, s) in first.iter_mut().zip(second) {
            f.extend(s);
        }
        Ok(first)
    }

    /// [`upsert`](Self::upsert) of the new states of the groups `located`
    /// found, in its group order: the keys are already placed, so they are
    /// not hashed again.
    pub(crate) fn upsert_located(&mut self, located: &Located, new: &RecordBatch) -> Result<()> {
        let stored = located.positions.len();
        let placement = Placement {
            updates: located
                .positions
                .iter()
                .enumerate()
                .map(|(g, &i)| (i, g as u32))
                .collect(),
            appended: (stored as u32..new.num_rows() as u32).collect(),
        };
        let new = self.stamped(new.clone())?;
        self.place(&placement, &new, &located.new_keys, &located.new_hashes)
    }
}

/// The rows of a probe grouped by key (see [`KeyedState::locate`]).
#[derive(Debug)]
pub(crate) struct Located {
    /// The stored rows of the keys found, in the order first met: groups
    /// `0..stored.num_rows()`.
    pub stored: RecordBatch,
    /// Per probe batch, each row's group.
    pub groups: Vec<Vec<usize>>,
    /// Per new key, in group order after the stored ones: the (batch, row)
    /// of the probe where it first appears.
    pub new_rows: Vec<(usize, usize)>,
    /// Where the stored rows are in the state, in group order.
    pub positions: Vec<u32>,
    /// The new keys, encoded, in group order (none when the key is the
    /// state's own column).
    pub(super) new_keys: KeyBytes,
    /// Their hashes, for the index.
    pub new_hashes: Vec<u64>,
}

/// A probe row whose key is not stored (see [`KeyedState::probe_index`]).
const NOT_STORED: u32 = u32::MAX;

/// Probes of fewer rows are looked up on one thread: below this, starting
/// a second costs about what it saves.
const PARALLEL_PROBE: usize = 1 << 15;

/// The machine's cores, asked once.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Which group [`KeyedState::locate`] gave each stored position it met:
/// a slot per stored row when the probe is a good part of the state (no
/// hashing), else a map of the positions met.
enum StoredGroups {
    Dense(Vec<u32>),
    Sparse(hashbrown::HashMap<u32, u32, RandomState>),
}

impl StoredGroups {
    fn new(stored: usize, probed: usize) -> Self {
        if stored <= probed.saturating_mul(4) {
            Self::Dense(vec![u32::MAX; stored])
        } else {
            Self::Sparse(hashbrown::HashMap::default())
        }
    }

    /// The group of stored position `pos`, made by `add` the first time.
    fn group_of(&mut self, pos: u32, add: impl FnOnce() -> usize) -> usize {
        // Groups number at most the probe's rows, under u32::MAX.
        let slot = match self {
            Self::Dense(slots) => {
                let slot = &mut slots[pos as usize];
                if *slot == u32::MAX {
                    *slot = add() as u32;
                }
                *slot
            }
            Self::Sparse(map) => *map.entry(pos).or_insert_with(|| add() as u32),
        };
        slot as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    use crate::state::keyed::tests::batch;

    #[test]
    fn locate_groups_probe_rows_by_key_stored_keys_first() {
        let mut s = KeyedState::new(batch(&[], &[]).schema(), 1).unwrap();
        s.upsert(&[batch(&["a", "b", "c"], &[1, 2, 3])]).unwrap();
        s.clear_changes();
        // Two probe batches (two partitions): keys repeat across them.
        let probe = [
            batch(&["x", "c", "a", "x"], &[0, 0, 0, 0]),
            batch(&["a", "y", "c"], &[0, 0, 0]),
        ];
        let located = s.locate(&probe).unwrap();
        let stored: Vec<i64> = located
            .stored
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        // c then a, as met; b was not probed.
        assert_eq!(stored, vec![3, 1]);
        // Groups: c = 0, a = 1 (stored), then x = 2, y = 3 (new).
        assert_eq!(located.groups, vec![vec![2, 0, 1, 2], vec![1, 3, 0]]);
        assert_eq!(located.new_rows, vec![(0, 0), (1, 1)]);

        // The groups' new rows, in group order, go where locate found them.
        s.upsert_located(&located, &batch(&["c", "a", "x", "y"], &[30, 10, 7, 8]))
            .unwrap();
        assert_eq!(s.num_rows(), 5);
        let all = s
            .lookup(&[batch(&["a", "b", "c", "x", "y"], &[0; 5])])
            .unwrap();
        let n = all.column(1).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(n, vec![10, 2, 30, 7, 8]);
        // The delta holds what changed: applied to the state before, it
        // gives the state after.
        let mut again = KeyedState::new(s.all().unwrap().schema(), 1).unwrap();
        again
            .upsert(&[batch(&["a", "b", "c"], &[1, 2, 3])])
            .unwrap();
        again.apply_delta(&s.delta().unwrap()).unwrap();
        let n = again
            .lookup(&[batch(&["a", "b", "c", "x", "y"], &[0; 5])])
            .unwrap()
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(n, vec![10, 2, 30, 7, 8]);
    }

    #[test]
    fn a_large_probe_looked_up_on_two_threads_groups_like_a_map() {
        // Stored: even keys. Probe: every key of 0..n twice over two
        // batches, more rows than one thread looks up.
        let n = PARALLEL_PROBE;
        let names = |keys: &mut dyn Iterator<Item = usize>| -> Vec<String> {
            keys.map(|k| format!("k{k}")).collect()
        };
        let stored = names(&mut (0..n).step_by(2));
        let stored_refs: Vec<&str> = stored.iter().map(String::as_str).collect();
        let mut s = KeyedState::new(batch(&[], &[]).schema(), 1).unwrap();
        s.upsert(&[batch(&stored_refs, &vec![1; stored.len()])])
            .unwrap();
        let probe_keys = [names(&mut (0..n).rev()), names(&mut (0..n))];
        let probe: Vec<RecordBatch> = probe_keys
            .iter()
            .map(|keys| {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                batch(&refs, &vec![0; refs.len()])
            })
            .collect();
        let located = s.locate(&probe).unwrap();
        // Each key one group, the same in both batches; the stored keys'
        // groups come first.
        let mut group_of: HashMap<&str, usize> = HashMap::new();
        for (keys, groups) in probe_keys.iter().zip(&located.groups) {
            for (k, &g) in keys.iter().zip(groups) {
                assert_eq!(*group_of.entry(k).or_insert(g), g, "{k}");
                let was_stored = k[1..].parse::<usize>().unwrap() % 2 == 0;
                assert_eq!(g < located.positions.len(), was_stored, "{k}");
            }
        }
        assert_eq!(group_of.len(), n);
        assert_eq!(located.positions.len(), stored.len());
        assert_eq!(located.new_rows.len(), n - stored.len());
    }
}
