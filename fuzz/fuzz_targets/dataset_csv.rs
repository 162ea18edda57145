//! A dataset CSV file: every row is read or refused with its line, never a panic; rows read
//! hold physical values.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stepcast::dataset::read_csv;

fuzz_target!(|data: &[u8]| {
    if let Ok(rows) = read_csv(Path::new("fuzz.csv"), data) {
        for r in rows {
            assert!(r.query.shape.validate().is_ok());
            assert!(!r.is_ok() || (r.time_us.is_finite() && r.time_us > 0.0));
        }
    }
});
