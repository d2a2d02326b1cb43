//! `java.util.Random`, bit for bit: the Nexmark generator seeds one per
//! event with the event's id, so matching Java's generator (Beam's, the
//! reference) means matching its random numbers exactly.

/// Java's 48-bit linear congruential generator.
pub(crate) struct JavaRandom {
    state: u64,
}

const MULTIPLIER: u64 = 0x5DEECE66D;
const ADDEND: u64 = 0xB;
const MASK: u64 = (1 << 48) - 1;

impl JavaRandom {
    /// `new Random(seed)`.
    pub(crate) fn new(seed: i64) -> Self {
        Self {
            state: (seed as u64 ^ MULTIPLIER) & MASK,
        }
    }

    fn next(&mut self, bits: u32) -> i32 {
        self.state = self.state.wrapping_mul(MULTIPLIER).wrapping_add(ADDEND) & MASK;
        (self.state >> (48 - bits)) as u32 as i32
    }

    /// `nextInt()`: any `i32`.
    pub(crate) fn next_int(&mut self) -> i32 {
        self.next(32)
    }

    /// `nextInt(bound)`: `0..bound`, for `bound > 0`.
    pub(crate) fn next_int_below(&mut self, bound: i32) -> i32 {
        debug_assert!(bound > 0);
        if bound & bound.wrapping_neg() == bound {
            return ((i64::from(bound) * i64::from(self.next(31))) >> 31) as i32;
        }
        loop {
            let bits = self.next(31);
            let value = bits % bound;
            // Java rejects the top partial range by overflow.
            if bits.wrapping_sub(value).wrapping_add(bound - 1) >= 0 {
                return value;
            }
        }
    }

    /// `nextLong()`.
    pub(crate) fn next_long(&mut self) -> i64 {
        (i64::from(self.next(32)) << 32).wrapping_add(i64::from(self.next(32)))
    }

    /// `nextDouble()`: `[0, 1)`.
    pub(crate) fn next_double(&mut self) -> f64 {
        let high = i64::from(self.next(26)) << 27;
        (high + i64::from(self.next(27))) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_java() {
        // What Java 17 prints for a fresh `new Random(42)` each time.
        assert_eq!(JavaRandom::new(42).next_int(), -1170105035);
        assert_eq!(JavaRandom::new(42).next_int_below(10), 0);
        assert_eq!(JavaRandom::new(42).next_long(), -5025562857975149833);
        let d = JavaRandom::new(42).next_double();
        assert!((d - 0.7275636800328681).abs() < 1e-16, "{d}");
    }
}
