//! Processing-time windows (over a `PROCTIME()` column, as Flink's
//! Nexmark q12) against a plain loop that gives each epoch's rows the
//! epoch's planned time. (q12 itself is checked in `nexmark`.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use sluice::{MemorySink, MemoryStream, OutputMode, Session, Window};

use crate::util::{block_on, timed_batch as to_batch, timed_schema as schema, Lcg};
use crate::windows::{fold, input, rfc3339_to_ms, windowed, Answer, DELAY_MS};

/// Processing-time windows (over a `PROCTIME()` column, as Flink's Nexmark
/// q12): every row of an epoch has the epoch's planned time, so a plain
/// loop places epoch N's rows in the window holding its planned time, and
/// a window is emitted in the first epoch planned at or after its end.
/// The rows' event times run backwards, so under the watermark their
/// stream declares most would be late; on processing time none is.
#[test]
fn processing_time_windows_place_rows_by_their_epochs_planned_time_across_restarts() {
    block_on(async {
        const SIZE_MS: i64 = 400;
        let mut rng = Lcg(11);
        let mut batches = input(&mut rng, 12);
        batches.reverse();
        let dir = tempfile::tempdir().unwrap();
        let window = Window::tumble("p_time", Duration::from_millis(SIZE_MS as u64));
        // Per epoch: its planned time, and what it emitted.
        let mut epochs: BTreeMap<u64, (i64, Answer)> = BTreeMap::new();
        let mut late_rows = 0;
        let mut fed = 0;
        for run_for in [5, batches.len() - 5] {
            let input = MemoryStream::new(schema());
            for b in &batches[..fed] {
                input.add_batch(to_batch(b)).unwrap();
            }
            let out = MemorySink::new();
            let frame = Session::new()
                .read_stream()
                .memory(&input)
                .unwrap()
                .with_watermark("ts", Duration::from_millis(DELAY_MS as u64))
                .unwrap()
                .with_column("p_time", sluice::Proctime::call())
                .unwrap();
            let query = windowed(&window)(frame)
                .write_stream()
                .memory(&out)
                .output_mode(OutputMode::Append)
                .checkpoint_location(dir.path())
                .start()
                .await
                .unwrap();
            for b in &batches[fed..fed + run_for] {
                input.add_batch(to_batch(b)).unwrap();
                query.process_all_available().await.unwrap();
                tokio::time::sleep(Duration::from_millis(100 + rng.next(300))).await;
            }
            fed += run_for;
            for p in query.recent_progress() {
                assert_eq!(
                    p.num_input_rows as usize,
                    batches[p.epoch as usize - 1].len()
                );
                late_rows += p.late_rows;
                let emitted = fold(&out.epoch_batches(p.epoch), "window_end");
                epochs.insert(p.epoch, (rfc3339_to_ms(&p.timestamp), emitted));
            }
            query.stop().await.unwrap();
        }
        assert_eq!(late_rows, 0, "no row is late on processing time");
        assert_eq!(epochs.len(), batches.len(), "one epoch per batch");

        // The plain loop: epoch N's rows in the window holding its planned time.
        let mut expected = Answer::new();
        for (&epoch, (planned, _)) in &epochs {
            let end = planned.div_euclid(SIZE_MS) * SIZE_MS + SIZE_MS;
            let mut per_key: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
            for row in &batches[epoch as usize - 1] {
                per_key.entry(row.0).or_default().push(row.1);
            }
            for (k, vs) in per_key {
                let e = expected
                    .entry((end, k))
                    .or_insert((0, 0, i64::MAX, i64::MIN, 0));
                e.0 += vs.len() as i64;
                e.1 += vs.iter().sum::<i64>();
                e.2 = e.2.min(*vs.iter().min().unwrap());
                e.3 = e.3.max(*vs.iter().max().unwrap());
            }
        }
        for ((end, k), e) in expected.iter_mut() {
            let residues: BTreeSet<i64> = epochs
                .iter()
                .filter(|(_, (planned, _))| planned.div_euclid(SIZE_MS) * SIZE_MS + SIZE_MS == *end)
                .flat_map(|(epoch, _)| &batches[*epoch as usize - 1])
                .filter(|row| row.0 == *k)
                .map(|row| row.1 % 3)
                .collect();
            e.4 = residues.len() as i64;
        }
        let last_planned = epochs.values().map(|(p, _)| *p).max().unwrap();
        let closed: Answer = expected
            .into_iter()
            .filter(|((end, _), _)| *end <= last_planned)
            .collect();
        assert!(closed.len() > 3, "several windows closed: {closed:?}");

        let mut emitted = Answer::new();
        let mut before = None;
        for (epoch, (planned, rows)) in &epochs {
            for (key, value) in rows {
                assert!(
                    key.0 <= *planned && before.is_none_or(|b| key.0 > b),
                    "window {key:?} emitted in epoch {epoch}, planned at {planned} (the one \
                     before at {before:?})"
                );
                assert!(emitted.insert(*key, *value).is_none(), "{key:?} twice");
            }
            before = Some(*planned);
        }
        assert_eq!(emitted, closed);
    });
}
