//! The physical range of every number a user gives: far beyond any real run, small enough that
//! every product of sizes stays inside 64 bits. Inputs outside are refused with the bound.

/// Largest tensor-, pipeline- or data-parallel degree: far beyond any cluster, small enough
/// that products of degrees and batch sizes cannot overflow.
pub const MAX_DEGREE: u64 = 1 << 20;
/// Most GPUs a layout may span (tp·cp·pp·dp), far beyond any cluster.
pub const MAX_WORLD: u64 = 1 << 32;
/// Largest micro-batch (sequences).
pub const MAX_MICRO_BATCH: u64 = 1 << 16;
/// Most micro-batches per step on one pipeline (gradient accumulation).
pub const MAX_MICRO_BATCHES: u64 = 1 << 18;
/// Longest sequence (tokens).
pub const MAX_SEQ_LEN: u64 = 1 << 24;
/// Most tokens in one micro-batch (micro-batch × sequence): 2^28, beyond any GPU's memory.
pub const MAX_MICRO_BATCH_TOKENS: u64 = 1 << 28;
/// Most sequences per step over all replicas.
pub const MAX_GLOBAL_BATCH: u64 = 1 << 32;
/// Smallest and largest data-parallel bucket (elements).
pub const MIN_BUCKET_ELEMENTS: u64 = 1 << 16;
pub const MAX_BUCKET_ELEMENTS: u64 = 1 << 40;

/// Largest value of any shape dimension of an operator (elements, bytes, parameters).
pub const MAX_SHAPE_DIM: u64 = 1 << 40;
/// Largest node count and GPUs per node of a collective.
pub const MAX_COLLECTIVE_SPAN: u64 = 1 << 20;
/// Shortest and longest operator time a measurement may hold, µs (1 ns to 10⁴ s).
pub const MIN_TIME_US: f64 = 1e-3;
pub const MAX_TIME_US: f64 = 1e10;

/// Most transformer layers, widest hidden or MLP size, most heads and largest vocabulary an
/// architecture may have.
pub const MAX_LAYERS: u64 = 1 << 14;
pub const MAX_WIDTH: u64 = 1 << 20;
pub const MAX_HEADS: u64 = 1 << 14;
pub const MAX_VOCAB: u64 = 1 << 24;

/// Checks that `value` lies in `range`; the message names the file (`what`), the field, the
/// value, the range with its unit, and the fix.
pub fn check_range(
    what: &str,
    field: &str,
    value: f64,
    range: std::ops::RangeInclusive<f64>,
    unit: &str,
) -> Result<(), String> {
    if range.contains(&value) {
        return Ok(());
    }
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    Err(format!(
        "{what}: {field} = {} is outside the physical range {} to {}{unit}: correct it",
        readable(value),
        readable(*range.start()),
        readable(*range.end())
    ))
}

/// A number as people write it: plain where that is short, in exponent form where not.
pub fn readable(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short numbers plainly, very large or very small ones in exponent form; zero and
    /// non-finite values plainly.
    #[test]
    fn a_number_reads_as_people_write_it() {
        assert_eq!(readable(0.0), "0");
        assert_eq!(readable(42.5), "42.5");
        assert_eq!(readable(-3.0), "-3");
        assert_eq!(readable(2e9), "2e9");
        assert_eq!(readable(1e-5), "1e-5");
        assert_eq!(readable(f64::INFINITY), "inf");
        let e = check_range("job.yaml", "seq_len", 2e9, 1.0..=1e6, "tokens").unwrap_err();
        assert_eq!(
            e,
            "job.yaml: seq_len = 2e9 is outside the physical range 1 to 1000000 tokens: correct it"
        );
        assert_eq!(check_range("f", "x", 1e6, 1.0..=1e6, ""), Ok(()));
    }
}
