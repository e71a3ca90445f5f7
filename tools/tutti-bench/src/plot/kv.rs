//! `kv`: tutti-kv puts and gets beside raw runtime writes and reads
//! (medians of the passes).

use super::bars::{self, Bar, BarChart};
use super::{render, PlotError};
use crate::schema::KvResult;

/// The chart of a `kv` result, as SVG.
pub fn svg(r: &KvResult) -> Result<String, PlotError> {
    if r.raw.is_empty() {
        return Err(PlotError::Empty("kv: no bandwidth passes (--rounds 0)"));
    }
    let m = KvResult::median_of;
    let series = ["raw runtime I/O".to_string(), "tutti-kv".to_string()];
    let bar = |label: &str, series: usize, value: f64| Bar { label: label.into(), series, value };
    let bars = [
        bar("write (raw)", 0, m(&r.raw, |p| p.write_gbps)),
        bar("put (tutti-kv)", 1, m(&r.store, |p| p.write_gbps)),
        bar("read (raw)", 0, m(&r.raw, |p| p.read_gbps)),
        bar("get (tutti-kv)", 1, m(&r.store, |p| p.read_gbps)),
    ];
    let title = format!(
        "tutti-kv vs raw, {} x {} KiB objects, {} drive(s), median of {} passes",
        r.objects,
        r.object_bytes >> 10,
        r.drives,
        r.raw.len()
    );
    let chart = BarChart {
        title: &title,
        x_desc: "operation",
        y_desc: "bandwidth, GB/s (10^9 bytes/s)",
        series: &series,
        bars: &bars,
    };
    render(|area| bars::draw(area, &chart))
}
