//! Bar charts: one bar per named measurement, coloured by series.

use plotters::prelude::*;

use super::{color, draw_err, Area, PlotError};

/// One bar.
#[derive(Debug, Clone)]
pub struct Bar {
    /// The label under it.
    pub label: String,
    /// Index into [`BarChart::series`]: its colour and legend entry.
    pub series: usize,
    /// Its height.
    pub value: f64,
}

/// A bar chart.
#[derive(Debug, Clone)]
pub struct BarChart<'a> {
    /// The caption.
    pub title: &'a str,
    /// The x axis' name.
    pub x_desc: &'a str,
    /// The y axis' name and unit.
    pub y_desc: &'a str,
    /// The series' names, for the legend.
    pub series: &'a [String],
    /// The bars, left to right.
    pub bars: &'a [Bar],
}

/// Draws `c` into `area`.
pub fn draw(area: &Area<'_>, c: &BarChart<'_>) -> Result<(), PlotError> {
    if c.bars.is_empty() {
        return Err(PlotError::Empty("no bars"));
    }
    let top = c.bars.iter().map(|b| b.value).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.2 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5..c.bars.len() as f64 - 0.5, 0.0..top)
        .map_err(draw_err)?;
    // Bar i is centred on x = i; with at most one tick per bar the ticks
    // fall on the whole numbers, which carry the bars' labels.
    let label = |x: &f64| match (x.round() - x).abs() < 1e-9 && *x >= 0.0 {
        true => c.bars.get(x.round() as usize).map_or_else(String::new, |b| b.label.clone()),
        false => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .x_labels(c.bars.len())
        .x_label_formatter(&label)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(draw_err)?;
    for (s, name) in c.series.iter().enumerate() {
        let fill = color(s).filled();
        let rects = c
            .bars
            .iter()
            .enumerate()
            .filter(|(_, b)| b.series == s)
            .map(|(i, b)| Rectangle::new([(i as f64 - 0.42, 0.0), (i as f64 + 0.42, b.value)], fill));
        let legend = move |(x, y): (i32, i32)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], fill);
        chart.draw_series(rects).map_err(draw_err)?.label(name.as_str()).legend(legend);
    }
    super::draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}
