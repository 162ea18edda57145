//! Shared output helpers: tables and number formatting.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, ContentArrangement, Table};

pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    t
}

/// Right-aligns every column from `from` on (the numeric ones).
pub fn align_numbers(t: &mut Table, from: usize) {
    let n = t.column_count();
    for i in from..n {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

pub fn pct(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".to_string()
    }
}

pub fn opt_pct(v: Option<f64>) -> String {
    v.map(pct).unwrap_or_else(|| "–".to_string())
}

pub fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", n as f64 / 1024.0)
    }
}
