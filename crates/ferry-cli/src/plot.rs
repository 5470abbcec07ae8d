//! `ferry bench --plot FILE.svg`: the rows of a run as a picture.
//!
//! Four panels, READ above and WRITE below: bandwidth (GB/s) against block
//! size, Ferry's transports as thick lines with dots and the baselines of
//! the same run as thin lines with squares; and Ferry's end-to-end latency,
//! p50 (solid) and p99 (light), against block size. Both axes of the
//! latency panels and the x axes are logarithmic. One batch size is drawn
//! (the smallest the run measured, 1 by default). SVG only, drawn by
//! `plotters`; text is left to the viewer's sans-serif font.

use std::path::Path;

use anyhow::Context;
use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::bench::Row;

/// The picture's size in pixels.
pub const SIZE: (u32, u32) = (1200, 860);

/// One line of a panel: which rows, and how it looks.
struct Series {
    label: &'static str,
    kind: &'static str,
    transport: &'static str,
    striped: bool,
    colour: RGBColor,
}

/// The colour of each transport (Ferry and its baseline share it).
pub const CMA: RGBColor = RGBColor(31, 119, 180);
/// TCP, one stream.
pub const TCP: RGBColor = RGBColor(255, 127, 14);
/// TCP split over several connections.
pub const TCP_STRIPED: RGBColor = RGBColor(44, 160, 44);
/// memcpy, the ceiling.
pub const MEMCPY: RGBColor = RGBColor(127, 127, 127);

const FERRY: [Series; 3] = [
    Series {
        label: "ferry cma",
        kind: "ferry",
        transport: "cma",
        striped: false,
        colour: CMA,
    },
    Series {
        label: "ferry tcp",
        kind: "ferry",
        transport: "tcp",
        striped: false,
        colour: TCP,
    },
    Series {
        label: "ferry tcp x4",
        kind: "ferry",
        transport: "tcp",
        striped: true,
        colour: TCP_STRIPED,
    },
];

const BASELINES: [Series; 3] = [
    Series {
        label: "raw process_vm_readv",
        kind: "cma",
        transport: "cma",
        striped: false,
        colour: CMA,
    },
    Series {
        label: "plain TCP stream",
        kind: "tcp_stream",
        transport: "tcp",
        striped: false,
        colour: TCP,
    },
    Series {
        label: "memcpy (1 thread)",
        kind: "memcpy",
        transport: "local",
        striped: false,
        colour: MEMCPY,
    },
];

/// `(block size, row)` of the rows of `s` for `op` and `batch`, by size.
fn points<'a>(rows: &'a [Row], s: &Series, op: &str, batch: usize) -> Vec<(f64, &'a Row)> {
    let mut v: Vec<(f64, &Row)> = rows
        .iter()
        .filter(|r| {
            r.kind == s.kind
                && r.transport == s.transport
                && r.streams.is_some() == s.striped
                && r.batch == batch
                && (r.op == op || (s.kind == "memcpy" && r.op == "copy"))
        })
        .map(|r| (r.block_size as f64, r))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

fn human(b: f64) -> String {
    let b = b.round() as u64;
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The SVG of `rows`; an error if no row can be drawn.
pub fn render(rows: &[Row]) -> anyhow::Result<String> {
    let batch = rows
        .iter()
        .filter(|r| r.kind == "ferry" && r.op != "cold_start")
        .map(|r| r.batch)
        .min()
        .context("no Ferry row to plot")?;
    let sizes = || {
        rows.iter()
            .filter(|r| r.batch == batch && r.op != "cold_start")
            .map(|r| r.block_size as f64)
    };
    let x_lo = sizes().fold(f64::INFINITY, f64::min) / 1.5;
    let x_hi = sizes().fold(0.0, f64::max) * 1.5;
    // The x axis is labelled at the measured sizes (4K, 64K, 1M...).
    let mut ticks: Vec<f64> = sizes().collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    let x = XAxis {
        lo: x_lo,
        hi: x_hi,
        ticks,
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            &format!(
                "ferry bench: {batch} descriptor{} per operation, two processes on one host",
                if batch == 1 { "" } else { "s" }
            ),
            ("sans-serif", 22),
        )?;
        let panels = root.split_evenly((2, 2));
        for (i, op) in ["read", "write"].into_iter().enumerate() {
            bandwidth(&panels[2 * i], rows, op, batch, &x)?;
            latency(&panels[2 * i + 1], rows, op, batch, &x)?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// Writes the SVG of `rows` to `path`.
pub fn write(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let svg = render(rows)?;
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The block-size axis shared by the four panels.
struct XAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl XAxis {
    fn range(&self) -> WithKeyPoints<LogCoord<f64>> {
        (self.lo..self.hi)
            .log_scale()
            .with_key_points(self.ticks.clone())
    }
}

/// Labels of a logarithmic axis of values from 0.001 to millions.
fn decimal(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn bandwidth(
    area: &Area<'_>,
    rows: &[Row],
    op: &str,
    batch: usize,
    x: &XAxis,
) -> anyhow::Result<()> {
    let gbps = || {
        FERRY
            .iter()
            .chain(BASELINES.iter())
            .flat_map(|s| points(rows, s, op, batch))
            .map(|(_, r)| r.gbps)
            .filter(|v| *v > 0.0)
    };
    let y_lo = gbps().fold(f64::INFINITY, f64::min).min(1.0) / 1.5;
    let y_hi = gbps().fold(1.0, f64::max) * 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{} bandwidth", op.to_uppercase()),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(x.range(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("block size (bytes)")
        .y_desc("GB/s")
        .y_label_formatter(&|v| decimal(*v))
        .x_label_formatter(&|v| human(*v))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (s, ferry) in FERRY
        .iter()
        .map(|s| (s, true))
        .chain(BASELINES.iter().map(|s| (s, false)))
    {
        let pts: Vec<(f64, f64)> = points(rows, s, op, batch)
            .into_iter()
            .map(|(x, r)| (x, r.gbps))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let c = s.colour;
        let width = if ferry { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))?
            .label(s.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width))
            });
        if ferry {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
        } else {
            chart.draw_series(pts.iter().map(|&(x, y)| {
                EmptyElement::at((x, y)) + Rectangle::new([(-3, -3), (3, 3)], c.stroke_width(1))
            }))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn latency(area: &Area<'_>, rows: &[Row], op: &str, batch: usize, x: &XAxis) -> anyhow::Result<()> {
    let lats = || {
        FERRY
            .iter()
            .flat_map(|s| points(rows, s, op, batch))
            .flat_map(|(_, r)| [r.lat_us_p50, r.lat_us_p99])
            .filter(|v| *v > 0.0)
    };
    let y_lo = lats().fold(f64::INFINITY, f64::min).min(1e6) / 1.5;
    let y_hi = lats().fold(1.0, f64::max) * 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{} end-to-end latency (p50 solid, p99 light)",
                op.to_uppercase()
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(x.range(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("block size (bytes)")
        .y_desc("microseconds")
        .x_label_formatter(&|v| human(*v))
        .y_label_formatter(&|v| decimal(*v))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for s in &FERRY {
        let pts = points(rows, s, op, batch);
        if pts.is_empty() {
            continue;
        }
        let c = s.colour;
        let p50: Vec<(f64, f64)> = pts.iter().map(|(x, r)| (*x, r.lat_us_p50)).collect();
        let p99: Vec<(f64, f64)> = pts.iter().map(|(x, r)| (*x, r.lat_us_p99)).collect();
        chart
            .draw_series(LineSeries::new(p50.clone(), c.stroke_width(3)))?
            .label(format!("{} p50", s.label))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart.draw_series(p50.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
        let light = c.mix(0.45);
        chart
            .draw_series(LineSeries::new(p99, light.stroke_width(2)))?
            .label(format!("{} p99", s.label))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], light.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}
