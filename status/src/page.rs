//! The page's files, built into the binary: its HTML, script and style,
//! and the chart library (uPlot 1.6.32, MIT, vendored from npm with its
//! licence under `status/assets/uplot/`). Nothing is fetched from the
//! internet, and nothing is built from JavaScript sources.

/// The page at `/`.
pub(crate) const INDEX: &str = include_str!("../assets/index.html");

/// A file under `/assets/`: its content type and content.
pub(crate) fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "page.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../assets/page.js"),
        ),
        "page.css" => (
            "text/css; charset=utf-8",
            include_str!("../assets/page.css"),
        ),
        "uPlot.iife.min.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../assets/uplot/uPlot.iife.min.js"),
        ),
        "uPlot.min.css" => (
            "text/css; charset=utf-8",
            include_str!("../assets/uplot/uPlot.min.css"),
        ),
        "uPlot.LICENSE.txt" => (
            "text/plain; charset=utf-8",
            include_str!("../assets/uplot/LICENSE"),
        ),
        _ => return None,
    })
}
