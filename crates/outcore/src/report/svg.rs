//! A small writer of plain SVG 1.1 text: rectangles, polylines / filled areas,
//! lines, text, each optionally with a `<title>` child (browsers show it as a
//! tooltip on hover, so the report needs no script at all).
//!
//! Why plain SVG instead of the `plotters` crate: the figures need two things
//! plotters' SVG backend does not give without a fork or post-processing —
//! per-element `<title>` hover text naming the op or tensor, and control over
//! how thousands of thin rectangles are merged to keep the file small — and
//! the whole writer is ~150 lines with no dependency (plotters would pull in a
//! font stack for text layout). Everything is written as text with every
//! user-provided string escaped, so names from imported graphs cannot break
//! the document.

use std::fmt::Write;

/// Escapes text for XML character data and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A coordinate with two decimals (sub-pixel precision is invisible and
/// costs bytes); non-finite values become 0 so the document stays valid.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "0".into();
    }
    let r = (x * 100.0).round() / 100.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r}")
    }
}

/// One SVG document being written.
#[derive(Debug)]
pub struct Svg {
    width_px: f64,
    height_px: f64,
    body: String,
}

impl Svg {
    /// An empty drawing of the given size in CSS pixels.
    pub fn new(width_px: f64, height_px: f64) -> Self {
        Svg {
            width_px,
            height_px,
            body: String::new(),
        }
    }

    pub fn width_px(&self) -> f64 {
        self.width_px
    }

    pub fn height_px(&self) -> f64 {
        self.height_px
    }

    /// Writes `<title>` for hover text inside an element, or closes it empty.
    fn close(&mut self, tag: &str, title: Option<&str>) {
        match title {
            Some(t) => {
                let _ = write!(self.body, "><title>{}</title></{tag}>", escape(t));
            }
            None => self.body.push_str("/>"),
        }
        self.body.push('\n');
    }

    /// A filled rectangle.
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, title: Option<&str>) {
        let _ = write!(
            self.body,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}""#,
            num(x),
            num(y),
            num(w.max(0.0)),
            num(h.max(0.0)),
            escape(fill)
        );
        self.close("rect", title);
    }

    /// A straight line.
    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, dash: bool) {
        let _ = write!(
            self.body,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="1.5"{}"#,
            num(x1),
            num(y1),
            num(x2),
            num(y2),
            escape(stroke),
            if dash {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            }
        );
        self.close("line", None);
    }

    /// A closed filled polygon through `points` (an area of a stacked chart).
    pub fn polygon(&mut self, points: &[(f64, f64)], fill: &str, title: Option<&str>) {
        if points.is_empty() {
            return;
        }
        self.body.push_str(r#"<polygon points=""#);
        for (i, (x, y)) in points.iter().enumerate() {
            if i > 0 {
                self.body.push(' ');
            }
            let _ = write!(self.body, "{},{}", num(*x), num(*y));
        }
        let _ = write!(self.body, r#"" fill="{}""#, escape(fill));
        self.close("polygon", title);
    }

    /// A circle marker.
    pub fn circle(&mut self, cx: f64, cy: f64, r: f64, fill: &str, title: Option<&str>) {
        let _ = write!(
            self.body,
            r#"<circle cx="{}" cy="{}" r="{}" fill="{}""#,
            num(cx),
            num(cy),
            num(r),
            escape(fill)
        );
        self.close("circle", title);
    }

    /// Text; `anchor` is `start`, `middle` or `end`.
    pub fn text(&mut self, x: f64, y: f64, size_px: f64, anchor: &str, content: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{}" y="{}" font-size="{}" text-anchor="{}" font-family="sans-serif">{}</text>"#,
            num(x),
            num(y),
            num(size_px),
            escape(anchor),
            escape(content)
        );
    }

    /// The document: standalone with the XML namespace, so the same text is a
    /// valid `.svg` file and valid inline SVG in HTML.
    pub fn finish(&self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">\n<rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n{}</svg>\n",
            self.body,
            w = num(self.width_px),
            h = num(self.height_px)
        )
    }
}

/// Round numbers for an axis from 0 to `max`: about `count` ticks at 1, 2 or
/// 5 times a power of ten.
pub fn ticks(max: f64, count: usize) -> Vec<f64> {
    if !(max.is_finite() && max > 0.0) || count == 0 {
        return vec![0.0];
    }
    let raw = max / count as f64;
    let pow = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * pow);
    let n = (max / step).floor() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_makes_names_safe_in_text_and_attributes() {
        assert_eq!(escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&#39;");
        assert_eq!(escape("x\u{1}y"), "x y");
    }

    #[test]
    fn elements_carry_their_hover_title_and_the_document_is_balanced() {
        let mut svg = Svg::new(100.0, 50.0);
        svg.rect(1.0, 2.0, 3.333, 4.0, "#f00", Some("op <conv1>"));
        svg.polygon(&[(0.0, 0.0), (10.0, 5.0)], "blue", None);
        svg.text(5.0, 5.0, 12.0, "start", "a & b");
        let doc = svg.finish();
        assert!(doc.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(doc.contains(r#"width="3.33""#), "{doc}");
        assert!(doc.contains("<title>op &lt;conv1&gt;</title></rect>"));
        assert!(doc.contains("a &amp; b"));
        assert_eq!(doc.matches("<svg").count(), doc.matches("</svg>").count());
        assert_eq!(doc.matches("<rect").count(), 2);
    }

    #[test]
    fn numbers_are_short_and_always_valid() {
        assert_eq!(num(2.0), "2");
        assert_eq!(num(2.456), "2.46");
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(num(f64::INFINITY), "0");
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.93, 4);
        assert_eq!(t, vec![0.0, 0.5]);
        assert_eq!(ticks(0.0, 4), vec![0.0]);
    }
}
