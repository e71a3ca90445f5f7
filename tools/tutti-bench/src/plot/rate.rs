//! `rate`: commands per second, one bar per run, coloured by path
//! (queue pair, runtime API, runtime API on tuttid).

use super::bars::{self, Bar, BarChart};
use super::{render, PlotError};
use crate::schema::{RateComparison, RateRun};

/// The chart of some `rate` runs, interleaved as measured: `a[0]`, `b[0]`,
/// `a[1]`, `b[1]`... (`b` may be empty), as SVG.
pub fn svg_runs(a: &[RateRun], b: &[RateRun]) -> Result<String, PlotError> {
    let mut series: Vec<String> = Vec::new();
    let mut bars: Vec<Bar> = Vec::new();
    let n = a.len().max(b.len());
    let mut counts: Vec<usize> = Vec::new();
    for r in (0..n).flat_map(|i| [a.get(i), b.get(i)]).flatten() {
        let s = series.iter().position(|s| *s == r.path).unwrap_or_else(|| {
            series.push(r.path.clone());
            counts.push(0);
            series.len() - 1
        });
        counts[s] += 1;
        bars.push(Bar {
            label: format!("{} #{}", r.path, counts[s]),
            series: s,
            value: r.commands_per_second / 1e6,
        });
    }
    let first = a.first().or(b.first()).ok_or(PlotError::Empty("no rate run"))?;
    let title = format!(
        "Commands/s, one submitting thread, queue depth {}, batch {}",
        first.queue_depth, first.batch
    );
    let chart = BarChart {
        title: &title,
        x_desc: "run (in the order measured)",
        y_desc: "million commands per second",
        series: &series,
        bars: &bars,
    };
    render(|area| bars::draw(area, &chart))
}

/// The chart of a `rate --compare` result, as SVG.
pub fn svg_compare(c: &RateComparison) -> Result<String, PlotError> {
    svg_runs(&c.queue_pair, &c.runtime)
}
