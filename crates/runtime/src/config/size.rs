//! [`ByteSize`], the config's byte-size type (`4096`, `128KiB`, `1 GiB`),
//! and [`ByteSizeParseError`], why a string is not one.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A size in bytes.
///
/// In YAML it is either a non-negative integer (bytes) or a string made of a
/// non-negative decimal integer, optional spaces and one of the IEC units
/// `B`, `KiB` (2^10), `MiB` (2^20), `GiB` (2^30), `TiB` (2^40), e.g. `4096`,
/// `"4096"`, `128KiB`, `1 GiB`. Units are case-sensitive; SI or shorthand
/// units (`K`, `KB`, `M`, `MB`, `G`, ...), fractions (`1.5GiB`), signs and
/// values that overflow `u64` are refused.
///
/// [`Display`](fmt::Display) prints the largest IEC unit that divides the
/// value exactly (`128KiB`, `1GiB`, `4097B`); the output parses back to the
/// same value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// The units [`ByteSize`] accepts, largest first, with their multipliers.
const BYTE_UNITS: [(&str, u64); 5] =
    [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)];

const BYTE_SIZE_EXPECTED: &str = "expected an integer number of bytes, or an integer with unit \
     B, KiB, MiB, GiB or TiB (e.g. 128KiB); K/KB/M/MB/G/GB/T/TB and fractions are not accepted";

/// Why a string is not a [`ByteSize`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ByteSizeParseError {
    /// The string has no leading decimal digits (empty, signed, or a fraction
    /// like `.5GiB`).
    #[error("invalid byte size {input:?}: {BYTE_SIZE_EXPECTED}")]
    NotANumber {
        /// The input as given.
        input: String,
    },
    /// The unit after the number is not one of the accepted IEC units.
    #[error("invalid byte size {input:?}: unknown unit {unit:?}; {BYTE_SIZE_EXPECTED}")]
    UnknownUnit {
        /// The input as given.
        input: String,
        /// What followed the number.
        unit: String,
    },
    /// The number has a fractional part (`1.5GiB`).
    #[error("invalid byte size {input:?}: fractions are not accepted; {BYTE_SIZE_EXPECTED}")]
    Fraction {
        /// The input as given.
        input: String,
    },
    /// The value does not fit in 64 bits.
    #[error("invalid byte size {input:?}: larger than 2^64 - 1 bytes")]
    Overflow {
        /// The input as given.
        input: String,
    },
}

impl ByteSize {
    /// `n` bytes.
    pub const fn b(n: u64) -> Self {
        Self(n)
    }
    /// `n` KiB (`n * 2^10` bytes). Panics on overflow (const context: fails to compile).
    pub const fn kib(n: u64) -> Self {
        Self(n * (1 << 10))
    }
    /// `n` MiB (`n * 2^20` bytes). Panics on overflow.
    pub const fn mib(n: u64) -> Self {
        Self(n * (1 << 20))
    }
    /// `n` GiB (`n * 2^30` bytes). Panics on overflow.
    pub const fn gib(n: u64) -> Self {
        Self(n * (1 << 30))
    }
    /// `n` TiB (`n * 2^40` bytes). Panics on overflow.
    pub const fn tib(n: u64) -> Self {
        Self(n * (1 << 40))
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl From<u64> for ByteSize {
    fn from(n: u64) -> Self {
        Self(n)
    }
}

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> Self {
        b.0
    }
}

impl std::str::FromStr for ByteSize {
    type Err = ByteSizeParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, rest) = s.split_at(digits_end);
        if digits.is_empty() {
            return Err(ByteSizeParseError::NotANumber { input: input.to_owned() });
        }
        if rest.starts_with(['.', ',']) {
            return Err(ByteSizeParseError::Fraction { input: input.to_owned() });
        }
        let unit = rest.trim_start();
        let multiplier = if unit.is_empty() {
            1
        } else {
            match BYTE_UNITS.iter().find(|(name, _)| *name == unit) {
                Some(&(_, m)) => m,
                None => {
                    return Err(ByteSizeParseError::UnknownUnit {
                        input: input.to_owned(),
                        unit: unit.to_owned(),
                    })
                }
            }
        };
        let overflow = || ByteSizeParseError::Overflow { input: input.to_owned() };
        let n: u64 = digits.parse().map_err(|_| overflow())?;
        n.checked_mul(multiplier).map(ByteSize).ok_or_else(overflow)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, m) = BYTE_UNITS
            .iter()
            .find(|(_, m)| self.0 != 0 && self.0.is_multiple_of(*m))
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{}{}", self.0 / m, name)
    }
}

impl Serialize for ByteSize {
    /// Serialized as its [`Display`](fmt::Display) form (`128KiB`), or as a
    /// plain integer when that has no larger unit than `B`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.is_multiple_of(1024) && self.0 != 0 {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u64(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ByteSizeVisitor;

        impl Visitor<'_> for ByteSizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a byte size (an integer number of bytes, or an integer with unit \
                     B, KiB, MiB, GiB or TiB)",
                )
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v).map(ByteSize).map_err(|_| {
                    E::custom(format_args!("invalid byte size {v}: negative; {BYTE_SIZE_EXPECTED}"))
                })
            }

            fn visit_u128<E: de::Error>(self, v: u128) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format_args!("invalid byte size {v}: larger than 2^64 - 1 bytes")))
            }

            fn visit_i128<E: de::Error>(self, v: i128) -> Result<ByteSize, E> {
                if v < 0 {
                    return Err(E::custom(format_args!(
                        "invalid byte size {v}: negative; {BYTE_SIZE_EXPECTED}"
                    )));
                }
                self.visit_u128(v.unsigned_abs())
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                Err(E::custom(format_args!(
                    "invalid byte size {v}: fractions are not accepted; {BYTE_SIZE_EXPECTED}"
                )))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_any(ByteSizeVisitor)
    }
}
