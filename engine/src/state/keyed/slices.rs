//! A store past the memory limit, checkpointed in slices: what each
//! epoch's file holds beside the changes (see `state::chain`'s sliced
//! chains).
//!
//! Every key falls in one of [`SLICES`] slices by [`slice_of`] its
//! encoding: a hash fixed for good, as a chain's files may come from
//! runs of different versions. The slice is also the first byte of the
//! key on disk, so a slice's rows there are one range to read.
//!
//! Each stage earns the rows it changed as credit and spends it on
//! images, one slice's rows (a [`SLICES`]th of the state) at a time, in
//! turn: an epoch writes its changes and about as many rows again, so a
//! turn of the slices takes as many epochs as changing the whole state
//! would.

use datafusion::arrow::array::{BooleanArray, RecordBatch};

use super::KeyedState;
use crate::error::Result;
use crate::state::chain::{Images, Slicing, Staged, SLICES};

/// The slice of a key, from its arrow-row encoding: FNV-1a, then
/// MurmurHash3's finaliser, so that keys that differ in one byte spread.
/// Fixed: a checkpoint's images depend on it (a test pins its values).
pub(super) fn slice_of(encoded: &[u8]) -> u8 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in encoded {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    (h % u64::from(SLICES)) as u8
}

/// A key's form on disk: its slice, then its encoding.
pub(super) fn disk_key(encoded: &[u8], out: &mut Vec<u8>) {
    out.push(slice_of(encoded));
    out.extend_from_slice(encoded);
}

impl KeyedState {
    /// What a store within a memory limit writes for an epoch's commit:
    /// its changes, and the slices the credit pays for from
    /// `slicing.next` on; at least one once the chain holds
    /// [`Slicing::FILES`] files. `None` for a store without a limit, which
    /// [`stage`](Self::stage) serves.
    pub(crate) fn stage_sliced(&mut self, slicing: Slicing) -> Result<Option<Staged>> {
        if self.spill.is_none() {
            return Ok(None);
        }
        let changed = self.changed.finish_cloned().count_set_bits() as u64
            + self
                .removed
                .iter()
                .map(|b| b.num_rows() as u64)
                .sum::<u64>();
        // Removals record only rows that left, so none changed means no changes.
        if changed == 0 {
            return Ok(Some(Staged::Unchanged));
        }
        let rows = self.num_rows().max(1);
        let Some(spill) = &mut self.spill else {
            return Ok(None);
        };
        // In rows × SLICES: a slice holds rows / SLICES, a fraction for a
        // small store.
        spill.credit += changed * u64::from(SLICES);
        let mut count = (spill.credit / rows).min(u64::from(SLICES)) as u16;
        if count == 0 && slicing.files >= Slicing::FILES {
            count = 1;
        }
        spill.credit = match count {
            SLICES => 0,
            n => spill.credit.saturating_sub(u64::from(n) * rows),
        };
        if count == 0 {
            return Ok(Some(Staged::Delta(self.pending_delta()?)));
        }
        let images = Images {
            first: slicing.next % SLICES,
            count,
        };
        Ok(Some(Staged::Sliced(self.delta_with(Some(images))?, images)))
    }

    /// Of `rows` (in memory), those whose key falls in one of `images`.
    pub(super) fn in_images(&self, rows: &RecordBatch, images: Images) -> Result<BooleanArray> {
        let keys = self
            .converter
            .convert_columns(&rows.columns()[..self.key_columns])?;
        Ok(keys
            .iter()
            .map(|k| Some(images.contains(u16::from(slice_of(k.data())))))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slices of some keys' encodings, pinned (the values computed
    /// apart, by the same FNV-1a and finaliser in Python): a change here
    /// would make an older checkpoint's images name the wrong keys.
    #[test]
    fn the_slice_of_a_key_is_fixed() {
        let got: Vec<u8> = [
            &b""[..],
            b"\x01",
            b"\x01\x80\0\0\0\0\0\0\x07",
            b"auction-42",
        ]
        .iter()
        .map(|k| slice_of(k))
        .collect();
        assert_eq!(got, vec![PINNED[0], PINNED[1], PINNED[2], PINNED[3]]);
        assert!(got.iter().all(|&s| u16::from(s) < SLICES));
    }

    const PINNED: [u8; 4] = [38, 12, 6, 40];
}
