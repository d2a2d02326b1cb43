//! JSON rows: a batch to one line per row (arrow-json's line-delimited
//! writer), and message values, one object each, to a batch (arrow-json's
//! vectorised decoder). Every JSON path of the crate goes through here: the
//! JSON format itself, the Protobuf encoder (rows to JSON to messages) and
//! Debezium change events.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::json::{LineDelimitedWriter, ReaderBuilder};
use datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{Result, SluiceError};

/// A batch's rows as JSON objects back to back in one buffer, row `i`
/// ended by the newline at `ends[i]`. JSON escapes newlines inside
/// strings, so the line breaks are exactly the row boundaries.
#[derive(Debug)]
pub(crate) struct JsonLines {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl JsonLines {
    /// Every row of `batch`, one object each.
    pub(crate) fn encode(batch: &RecordBatch) -> Result<Self> {
        let mut bytes = Vec::with_capacity(batch.num_rows() * 32);
        {
            let mut w = LineDelimitedWriter::new(&mut bytes);
            w.write(batch)?;
            w.finish()?;
        }
        let ends: Vec<usize> = memchr::memchr_iter(b'\n', &bytes).collect();
        if ends.len() != batch.num_rows() {
            return Err(SluiceError::Internal(format!(
                "JSON encoder produced {} lines for {} rows",
                ends.len(),
                batch.num_rows()
            )));
        }
        Ok(Self { bytes, ends })
    }

    /// The number of rows.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Row `i`'s object, without its newline.
    pub(crate) fn row(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] + 1 };
        &self.bytes[start..self.ends[i]]
    }

    /// Every row, in order.
    pub(crate) fn rows(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.row(i))
    }
}

/// Whether `t` holds a DECIMAL, at any depth.
fn has_decimal(t: &DataType) -> bool {
    match t {
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => true,
        DataType::Struct(fields) => fields.iter().any(|f| has_decimal(f.data_type())),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => has_decimal(f.data_type()),
        _ => false,
    }
}

/// The largest exponent a number may be written with, and the most
/// digits: no DECIMAL holds more than 76 digits, and arrow's decimal
/// parser counts digits in a `u8` and keeps the exponent in an `i16`,
/// which overflow (a panic in a debug build; in release they wrap and
/// give a wrong value; found by the source's fuzz target).
const MAX_EXPONENT: u32 = 1_000;
const MAX_DIGITS: usize = 200;

/// An error for a number of `value` written with more than [`MAX_DIGITS`]
/// digits before its exponent, or an exponent beyond [`MAX_EXPONENT`]: a
/// number token, or a string that is one (arrow reads a DECIMAL from
/// either). Arrow's tokenizer takes every `[0-9+-]` after the `e` as the
/// exponent's (`1e3-9001` is read as exponent 39001), so all of them
/// count.
fn refuse_huge_exponents(value: &[u8]) -> Result<()> {
    let huge = |number: &[u8]| {
        let e = number
            .iter()
            .position(|b| matches!(b, b'e' | b'E'))
            .unwrap_or(number.len());
        let mantissa = &number[..e];
        let numeric = mantissa
            .iter()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+'))
            && mantissa.iter().any(u8::is_ascii_digit);
        if !numeric {
            return false;
        }
        if mantissa.iter().filter(|b| b.is_ascii_digit()).count() > MAX_DIGITS {
            return true;
        }
        let mut exponent: u32 = 0;
        let run = number
            .get(e + 1..)
            .unwrap_or_default()
            .iter()
            .take_while(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-'));
        for d in run.filter(|d| d.is_ascii_digit()) {
            exponent = exponent
                .saturating_mul(10)
                .saturating_add(u32::from(d - b'0'));
        }
        exponent > MAX_EXPONENT
    };
    let refuse = || {
        Err(ArrowError::JsonError(format!(
            "a number with more than {MAX_DIGITS} digits or an exponent beyond {MAX_EXPONENT}, \
             which no DECIMAL holds"
        ))
        .into())
    };
    let mut i = 0;
    while i < value.len() {
        match value[i] {
            b'"' => {
                let start = i + 1;
                let mut escaped = false;
                i += 1;
                while i < value.len() && (escaped || value[i] != b'"') {
                    escaped = !escaped && value[i] == b'\\';
                    i += 1;
                }
                if huge(&value[start..i.min(value.len())]) {
                    return refuse();
                }
                i += 1;
            }
            b if b.is_ascii_digit() || b == b'-' => {
                let start = i;
                while i < value.len()
                    && (value[i].is_ascii_digit()
                        || matches!(value[i], b'.' | b'e' | b'E' | b'+' | b'-'))
                {
                    i += 1;
                }
                if huge(&value[start..i]) {
                    return refuse();
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Decodes JSON message values, one object each, into one batch of
/// `schema` (arrow-json's vectorised decoder): the Kafka source's fast
/// path, public so that `benches/micro.rs` can measure it alone. Every
/// message must be exactly one object of `schema`: one that holds none
/// (blank), more than one, or something else is an error, and the source
/// then decodes record by record to name (or skip) the bad one.
///
/// ```
/// # use std::sync::Arc;
/// # use sluice_engine::arrow::datatypes::{DataType, Field, Schema};
/// let schema = Arc::new(Schema::new(vec![Field::new("price", DataType::Int64, true)]));
/// let values: [&[u8]; 2] = [br#"{"price": 7}"#, br#"{"price": 9}"#];
/// let batch = sluice_kafka::decode_json(&schema, values)?;
/// assert_eq!(batch.num_rows(), 2);
/// let two_in_one: [&[u8]; 2] = [br#"{"price": 7}{"price": 8}"#, br#"{"price": 9}"#];
/// assert!(sluice_kafka::decode_json(&schema, two_in_one).is_err());
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
pub fn decode_json<'a>(
    schema: &SchemaRef,
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<RecordBatch> {
    let values = values.into_iter();
    let decimals = schema.fields().iter().any(|f| has_decimal(f.data_type()));
    let mut decoder = ReaderBuilder::new(Arc::clone(schema))
        .with_batch_size(values.size_hint().0.max(1))
        .build_decoder()?;
    for value in values {
        if decimals {
            refuse_huge_exponents(value)?;
        }
        // One message, one value: the decoder stops early once its batch
        // is full, so a message of two values would push the last
        // message's row out unseen, and a message of half a value would
        // merge with the next.
        let before = decoder.len();
        let read = decoder.decode(value)? + decoder.decode(b"\n")?;
        if read != value.len() + 1 || decoder.has_partial_record() || decoder.len() != before + 1 {
            let values = decoder.len() - before;
            return Err(ArrowError::JsonError(if values == 0 {
                "the message holds no JSON value".into()
            } else {
                format!("the message holds {values} or more JSON values, not one")
            })
            .into());
        }
    }
    Ok(decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(schema))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_no_decimal_holds_are_refused_in_numbers_and_numeric_strings() {
        let long = format!("{{\"a\": {}}}", "9".repeat(MAX_DIGITS + 1));
        assert!(refuse_huge_exponents(long.as_bytes()).is_err());
        let fine = format!("{{\"a\": {}}}", "9".repeat(MAX_DIGITS));
        assert!(refuse_huge_exponents(fine.as_bytes()).is_ok());
        for ok in [
            &b"{\"a\": 1e5}"[..],
            b"{\"a\": 1.5E-1000}",
            b"{\"s\": \"x1e99999\"}",
            b"{\"e\": 3}",
        ] {
            assert!(
                refuse_huge_exponents(ok).is_ok(),
                "{}",
                String::from_utf8_lossy(ok)
            );
        }
        for bad in [
            &b"{\"a\": -0.1e3090001}"[..],
            b"[1E+32768]",
            b"{\"s\": \"\\\"\", \"a\": 2e1001}",
            b"{\"a\": -0.01e3-9001}",
            b"{\"a\": \"1e99999\"}",
            b"{\"a\": 1999999999999999999991e3099999999999999999992.5}",
        ] {
            assert!(
                refuse_huge_exponents(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
