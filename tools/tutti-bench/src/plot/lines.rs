//! Line charts: numeric x against numeric y, one or more named lines.

use plotters::prelude::*;

use super::{color, draw_err, Area, PlotError};

/// One named line.
#[derive(Debug, Clone)]
pub struct Line {
    /// The legend's name for it.
    pub name: String,
    /// `(x, y)` in order of x.
    pub points: Vec<(f64, f64)>,
    /// Dashed (a model or bound rather than a measurement).
    pub dashed: bool,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct LineChart<'a> {
    /// The caption.
    pub title: &'a str,
    /// The x axis' name and unit.
    pub x_desc: &'a str,
    /// The y axis' name and unit.
    pub y_desc: &'a str,
    /// The lines, each in its own colour.
    pub lines: &'a [Line],
    /// Label only whole-number x ticks (counts such as drives).
    pub integer_x: bool,
    /// Logarithmic x (positive data; values below 1 drawn at 1).
    pub log_x: bool,
}

/// The smallest and largest of `v` (0..1 when empty or flat).
fn span(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v.filter(|x| x.is_finite()).fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(x), h.max(x)));
    if lo > hi {
        (0.0, 1.0)
    } else if lo == hi {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    }
}

/// Draws `c` into `area`: y from 0 (or below, for negative data), x over
/// the data with a small pad.
pub fn draw(area: &Area<'_>, c: &LineChart<'_>) -> Result<(), PlotError> {
    let to_x = |x: f64| if c.log_x { x.max(1.0).log10() } else { x };
    let all = || c.lines.iter().flat_map(|l| l.points.iter().map(|&(x, y)| (to_x(x), y)));
    if all().next().is_none() {
        return Err(PlotError::Empty("no points"));
    }
    let (x0, x1) = span(all().map(|p| p.0));
    let (y0, y1) = span(all().map(|p| p.1));
    let pad = (x1 - x0) * 0.05;
    let mut chart = ChartBuilder::on(area)
        .caption(c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x0 - pad..x1 + pad, y0.min(0.0)..y1 * 1.15)
        .map_err(draw_err)?;
    let (integer_x, log_x) = (c.integer_x, c.log_x);
    let fmt_x = move |x: &f64| match (integer_x, log_x, x.fract() == 0.0) {
        (_, true, true) => format!("{:.0}", 10f64.powf(*x)),
        (_, true, false) => String::new(),
        (true, _, false) => String::new(),
        (true, _, true) => format!("{x:.0}"),
        _ => format!("{x}"),
    };
    chart
        .configure_mesh()
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .x_label_formatter(&fmt_x)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(draw_err)?;
    for (i, l) in c.lines.iter().enumerate() {
        let style = color(i).stroke_width(2);
        let legend = move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 20, y)], style);
        let points = l.points.iter().map(|&(x, y)| (to_x(x), y));
        let drawn = if l.dashed {
            chart.draw_series(DashedLineSeries::new(points, 8, 5, style))
        } else {
            chart.draw_series(LineSeries::new(points, style).point_size(3))
        };
        drawn.map_err(draw_err)?.label(l.name.as_str()).legend(legend);
    }
    super::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
}
