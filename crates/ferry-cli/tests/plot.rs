//! `ferry bench --plot`: the SVG renders (rasterized with resvg) at its
//! size, with every series' colour on it; the README's picture too.

use ferry_cli::bench::Row;
use ferry_cli::plot::{self, CMA, MEMCPY, SIZE, TCP, TCP_STRIPED};
use plotters::style::RGBColor;
use resvg::{tiny_skia, usvg};

fn row(kind: &str, transport: &str, op: &str, block: u64, gbps: f64) -> Row {
    let lat = block as f64 / gbps / 1e3;
    Row {
        kind: kind.into(),
        transport: transport.into(),
        op: op.into(),
        block_size: block,
        batch: 1,
        iters: 10,
        gbps,
        ops_per_s: 1e6 / lat,
        lat_us_avg: lat,
        lat_us_p50: lat,
        lat_us_p99: lat * 1.5,
        streams: None,
        baseline: None,
        ratio: None,
        reg_us: None,
        digest: false,
    }
}

/// Rows shaped like a real run's: every kind, both ops, four sizes.
fn rows() -> Vec<Row> {
    let mut v = Vec::new();
    for (i, block) in [4u64 << 10, 64 << 10, 1 << 20, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let f = (i + 1) as f64;
        v.push(row("memcpy", "local", "copy", block, 20.0 * f));
        for op in ["read", "write"] {
            v.push(row("cma", "cma", op, block, 3.0 * f));
            v.push(row("ferry", "cma", op, block, 2.0 * f));
            v.push(row("tcp_stream", "tcp", op, block, 1.0 * f));
            v.push(row("ferry", "tcp", op, block, 0.8 * f));
            if block >= 8 << 20 {
                let mut s = row("ferry", "tcp", op, block, 1.2 * f);
                s.streams = Some(4);
                v.push(s);
            }
        }
    }
    // A cold start row of another shape is ignored by the plot.
    v.push(row("ferry", "tcp", "cold_start", 4096, 0.001));
    v
}

/// The picture as pixels.
fn rasterize(svg: &str) -> tiny_skia::Pixmap {
    let tree = usvg::Tree::from_str(svg, &usvg::Options::default()).expect("valid SVG");
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).expect("a size");
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
}

fn count(p: &tiny_skia::Pixmap, c: RGBColor) -> usize {
    p.pixels()
        .iter()
        .filter(|px| {
            let d = |a: u8, b: u8| a.abs_diff(b) <= 8;
            px.alpha() == 255 && d(px.red(), c.0) && d(px.green(), c.1) && d(px.blue(), c.2)
        })
        .count()
}

fn check(svg: &str, colours: &[(&str, RGBColor)]) {
    let p = rasterize(svg);
    assert_eq!((p.width(), p.height()), SIZE);
    let white = count(&p, RGBColor(255, 255, 255));
    let total = p.pixels().len();
    assert!(
        white > total / 2,
        "mostly white background: {white} of {total}"
    );
    assert!(
        white < total * 99 / 100,
        "something is drawn: {white} white of {total}"
    );
    for (name, c) in colours {
        let n = count(&p, *c);
        assert!(n > 200, "{name}: {n} pixels of its colour");
    }
}

#[test]
fn the_plot_renders_with_every_series() {
    let svg = plot::render(&rows()).unwrap();
    check(
        &svg,
        &[
            ("cma", CMA),
            ("tcp", TCP),
            ("tcp x4", TCP_STRIPED),
            ("memcpy", MEMCPY),
        ],
    );
    for label in [
        "ferry cma",
        "plain TCP stream",
        "memcpy (1 thread)",
        "64M",
        "GB/s",
    ] {
        assert!(svg.contains(label), "{label}");
    }
}

#[test]
fn a_plot_needs_ferry_rows() {
    let only_baselines: Vec<Row> = rows().into_iter().filter(|r| r.kind != "ferry").collect();
    assert!(plot::render(&only_baselines).is_err());
    assert!(plot::render(&[]).is_err());
    // TCP only (no cross-memory attach, as between hosts): still draws.
    let tcp: Vec<Row> = rows()
        .into_iter()
        .filter(|r| r.transport != "cma")
        .collect();
    check(&plot::render(&tcp).unwrap(), &[("tcp", TCP)]);
}

#[test]
fn the_readme_picture_renders() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench.svg");
    let svg =
        std::fs::read_to_string(path).expect("docs/bench.svg (ferry bench --plot docs/bench.svg)");
    check(&svg, &[("cma", CMA), ("tcp", TCP), ("memcpy", MEMCPY)]);
}
