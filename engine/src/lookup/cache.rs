//! The lookup cache: a lookup table's answers per key, kept for a while so
//! that keys seen again are not asked again, as Flink's `lookup.cache`.
//!
//! Without `'lookup.cache' = 'PARTIAL'` (Flink's default) every epoch asks
//! the table for every key its rows carry. With it, an answer is kept until
//! `expire-after-write` (or `expire-after-access` unused) has passed, at
//! most `max-rows` rows in all, the least recently used going first; a key
//! the table did not have is kept as such unless `cache-missing-key` is
//! false. A kept answer can be as old as the expiry: that is what the
//! options trade for fewer lookups.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::{take, take_record_batch};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;

use crate::error::{Result, SluiceError};
use crate::options::Options;

/// How a lookup table keeps its answers (Flink's `lookup.cache` options).
///
/// ```
/// use std::time::Duration;
/// use sluice_engine::{LookupCacheConfig, Options};
/// let mut options = Options::from_pairs([
///     ("lookup.cache", "PARTIAL"),
///     ("lookup.partial-cache.expire-after-write", "10 s"),
///     ("lookup.partial-cache.max-rows", "1000"),
/// ]);
/// let cache = LookupCacheConfig::from_options(&mut options).unwrap();
/// assert_eq!(cache.expire_after_write, Some(Duration::from_secs(10)));
/// assert_eq!(cache.max_rows, Some(1000));
/// assert!(options.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LookupCacheConfig {
    /// Whether answers are kept at all (`'lookup.cache' = 'PARTIAL'`).
    pub enabled: bool,
    /// At most this many rows are kept.
    pub max_rows: Option<u64>,
    /// An answer is asked again once this long has passed since it came.
    pub expire_after_write: Option<Duration>,
    /// An answer is asked again once this long has passed since it was used.
    pub expire_after_access: Option<Duration>,
    /// Whether a key the table does not have is kept as such.
    pub cache_missing_key: bool,
}

impl LookupCacheConfig {
    /// Takes the cache's options out of `options`: Flink's
    /// `lookup.cache`, `lookup.partial-cache.*` and the older
    /// `lookup.cache.max-rows`, `lookup.cache.ttl` and
    /// `lookup.cache.caching-missing-key` (a cache when both of the first
    /// two are set).
    pub fn from_options(options: &mut Options) -> Result<Self> {
        let mode = options.take_choice("lookup.cache", &["none", "partial"])?;
        let max_rows = options.take_parsed::<u64>("lookup.partial-cache.max-rows", "a count")?;
        let write = options.take_duration("lookup.partial-cache.expire-after-write")?;
        let access = options.take_duration("lookup.partial-cache.expire-after-access")?;
        let missing = options
            .take_parsed::<bool>("lookup.partial-cache.cache-missing-key", "true or false")?;
        let old_rows = options.take_parsed::<u64>("lookup.cache.max-rows", "a count")?;
        let old_ttl = options.take_duration("lookup.cache.ttl")?;
        let old_missing =
            options.take_parsed::<bool>("lookup.cache.caching-missing-key", "true or false")?;
        if mode.as_deref() == Some("partial") {
            if write.is_none() && access.is_none() && max_rows.is_none() {
                return Err(SluiceError::config(
                    "'lookup.cache' = 'PARTIAL' needs a bound: \
                     'lookup.partial-cache.expire-after-write', \
                     'lookup.partial-cache.expire-after-access' or \
                     'lookup.partial-cache.max-rows' (Flink refuses it too)",
                ));
            }
            return Ok(Self {
                enabled: true,
                max_rows,
                expire_after_write: write,
                expire_after_access: access,
                cache_missing_key: missing.unwrap_or(true),
            });
        }
        let legacy = matches!((old_rows, old_ttl), (Some(r), Some(t)) if r > 0 && !t.is_zero());
        Ok(Self {
            enabled: mode.is_none() && legacy,
            max_rows: old_rows,
            expire_after_write: old_ttl,
            expire_after_access: None,
            cache_missing_key: old_missing.unwrap_or(true),
        })
    }
}

/// One key's answer: its rows, or `None` for a key the table did not have.
#[derive(Debug)]
struct Entry {
    rows: Option<RecordBatch>,
    written: Instant,
    used: Instant,
}

impl Entry {
    fn size(&self) -> u64 {
        self.rows.as_ref().map_or(1, |r| r.num_rows().max(1) as u64)
    }
}

/// A lookup table's kept answers, shared by every scan of the table.
#[derive(Debug, Clone)]
pub(crate) struct LookupCache {
    config: LookupCacheConfig,
    entries: Arc<Mutex<HashMap<Vec<ScalarValue>, Entry>>>,
}

impl LookupCache {
    pub(crate) fn new(config: LookupCacheConfig) -> Self {
        Self {
            config,
            entries: Arc::default(),
        }
    }

    /// The rows of `keys` (distinct, non-null; one array per column of
    /// `columns`): the kept ones, and what `fetch` answers for the rest.
    pub(crate) async fn lookup<F, Fut>(
        &self,
        columns: &[usize],
        keys: &[ArrayRef],
        fetch: F,
    ) -> Result<Vec<RecordBatch>>
    where
        F: FnOnce(Vec<ArrayRef>) -> Fut,
        Fut: Future<Output = Result<RecordBatch>>,
    {
        if !self.config.enabled {
            return Ok(vec![fetch(keys.to_vec()).await?]);
        }
        let count = keys.first().map_or(0, |k| k.len());
        let key_of = |arrays: &[ArrayRef], row: usize| -> Result<Vec<ScalarValue>> {
            arrays
                .iter()
                .map(|a| Ok(ScalarValue::try_from_array(a, row)?))
                .collect()
        };
        let now = Instant::now();
        let mut found = Vec::new();
        let mut missing = Vec::new();
        let mut missing_keys = Vec::new();
        {
            let mut entries = self.lock();
            for row in 0..count {
                let key = key_of(keys, row)?;
                match entries.get_mut(&key).filter(|e| self.fresh(e, now)) {
                    Some(entry) => {
                        entry.used = now;
                        found.extend(entry.rows.clone());
                    }
                    None => {
                        missing.push(row as u32);
                        missing_keys.push(key);
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(found);
        }
        let indices = UInt32Array::from(missing);
        let wanted = keys
            .iter()
            .map(|k| Ok(take(k, &indices, None)?))
            .collect::<Result<Vec<_>>>()?;
        let fetched = fetch(wanted).await?;
        // Which fetched rows answer which key.
        let fetched_keys: Vec<ArrayRef> = columns
            .iter()
            .map(|&c| Arc::clone(fetched.column(c)))
            .collect();
        let mut rows_of: HashMap<Vec<ScalarValue>, Vec<u32>> = HashMap::new();
        for row in 0..fetched.num_rows() {
            rows_of
                .entry(key_of(&fetched_keys, row)?)
                .or_default()
                .push(row as u32);
        }
        let mut entries = self.lock();
        for key in missing_keys {
            let rows = match rows_of.remove(&key) {
                Some(rows) => Some(take_record_batch(&fetched, &UInt32Array::from(rows))?),
                None if self.config.cache_missing_key => None,
                None => continue,
            };
            entries.insert(
                key,
                Entry {
                    rows,
                    written: now,
                    used: now,
                },
            );
        }
        self.evict(&mut entries, now);
        found.push(fetched);
        Ok(found)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<ScalarValue>, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fresh(&self, entry: &Entry, now: Instant) -> bool {
        let within = |limit: Option<Duration>, since: Instant| {
            limit.is_none_or(|l| now.duration_since(since) < l)
        };
        within(self.config.expire_after_write, entry.written)
            && within(self.config.expire_after_access, entry.used)
    }

    /// Drops expired answers, then the least recently used until at most
    /// `max_rows` rows are kept.
    fn evict(&self, entries: &mut HashMap<Vec<ScalarValue>, Entry>, now: Instant) {
        entries.retain(|_, e| self.fresh(e, now));
        let Some(max) = self.config.max_rows else {
            return;
        };
        let mut total: u64 = entries.values().map(Entry::size).sum();
        if total <= max {
            return;
        }
        let mut by_use: Vec<(Instant, Vec<ScalarValue>)> =
            entries.iter().map(|(k, e)| (e.used, k.clone())).collect();
        by_use.sort_by_key(|(used, _)| *used);
        for (_, key) in by_use {
            if total <= max {
                break;
            }
            if let Some(e) = entries.remove(&key) {
                total -= e.size();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The table: id → name for ids 1..=3.
    fn table(ids: &ArrayRef) -> RecordBatch {
        let ids = ids.as_any().downcast_ref::<Int64Array>().unwrap();
        let have: Vec<i64> = ids
            .iter()
            .flatten()
            .filter(|i| (1..=3).contains(i))
            .collect();
        let names: Vec<String> = have.iter().map(|i| format!("n{i}")).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(have)),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap()
    }

    fn keys(ids: &[i64]) -> Vec<ArrayRef> {
        vec![Arc::new(Int64Array::from(ids.to_vec()))]
    }

    async fn rows(cache: &LookupCache, ids: &[i64], asked: &AtomicUsize) -> usize {
        let batches = cache
            .lookup(&[0], &keys(ids), |k| async move {
                asked.fetch_add(k[0].len(), Ordering::SeqCst);
                Ok(table(&k[0]))
            })
            .await
            .unwrap();
        batches.iter().map(|b| b.num_rows()).sum()
    }

    #[tokio::test]
    async fn kept_answers_and_missing_keys_are_not_asked_again_until_they_expire() {
        let config = LookupCacheConfig {
            enabled: true,
            expire_after_write: Some(Duration::from_millis(200)),
            cache_missing_key: true,
            ..Default::default()
        };
        let cache = LookupCache::new(config);
        let asked = AtomicUsize::new(0);
        assert_eq!(rows(&cache, &[1, 2, 9], &asked).await, 2);
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // 1, 2 and the missing 9 are kept; only 3 is asked.
        assert_eq!(rows(&cache, &[1, 2, 3, 9], &asked).await, 3);
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(rows(&cache, &[1, 9], &asked).await, 1);
        assert_eq!(asked.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn without_a_cache_every_key_is_asked_and_max_rows_bounds_what_is_kept() {
        let asked = AtomicUsize::new(0);
        let none = LookupCache::new(LookupCacheConfig::default());
        rows(&none, &[1, 2], &asked).await;
        rows(&none, &[1, 2], &asked).await;
        assert_eq!(asked.load(Ordering::SeqCst), 4);

        let config = LookupCacheConfig {
            enabled: true,
            max_rows: Some(2),
            cache_missing_key: false,
            ..Default::default()
        };
        let small = LookupCache::new(config);
        let asked = AtomicUsize::new(0);
        rows(&small, &[1, 2, 3, 8], &asked).await;
        assert!(small.lock().len() <= 2, "{:?}", small.lock().len());
        assert!(small
            .lock()
            .keys()
            .all(|k| k != &vec![ScalarValue::Int64(Some(8))]));
    }

    #[test]
    fn partial_without_a_bound_is_refused_and_the_old_options_still_count() {
        let mut o = Options::from_pairs([("lookup.cache", "partial")]);
        let err = LookupCacheConfig::from_options(&mut o).unwrap_err();
        assert!(err.to_string().contains("needs a bound"), "{err}");
        let mut o =
            Options::from_pairs([("lookup.cache.max-rows", "10"), ("lookup.cache.ttl", "1s")]);
        let c = LookupCacheConfig::from_options(&mut o).unwrap();
        assert!(c.enabled && c.max_rows == Some(10));
    }
}
