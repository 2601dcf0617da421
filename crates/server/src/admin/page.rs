//! The status page's model and its HTML: sections of rows of cells, each cell's text
//! formatted here, once, and the first view rendered from them (what the page's script
//! renders from `/status.json` to the DOM, the same elements); the page itself
//! (`status.html`, its script and style inline) and its Content-Security-Policy.
//!
//! Every string is escaped on its way into HTML ([`escape`]); the script places text
//! (`textContent`) and attributes only, so nothing it is given is parsed as HTML.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;

/// The page, its script and style inline (no build step, nothing fetched but
/// `/status.json`); `<!--page-->` is where the first view goes.
const TEMPLATE: &str = include_str!("status.html");

/// `Content-Security-Policy` for `GET /`: nothing runs but the page's own script and
/// style, named by their hashes (so a string that got past [`escape`] still could not
/// run), and the script may fetch from this listener only.
pub(super) fn content_security_policy() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        let hash = |tag: &str| {
            let open = format!("<{tag}>");
            let start = TEMPLATE.find(&open).expect("the template's element") + open.len();
            let end = start
                + TEMPLATE[start..]
                    .find(&format!("</{tag}>"))
                    .expect("its end");
            let inline = &TEMPLATE.as_bytes()[start..end];
            let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, inline);
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
            )
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash("script"),
            hash("style")
        )
    })
}

/// The page's model, as `/status.json` has it and both renderings read it.
#[derive(Debug, Serialize)]
pub(super) struct Page {
    /// When the figures were read, Unix seconds.
    pub(super) time: f64,
    /// The seconds the rates are over; `None` before a second read.
    pub(super) interval_s: Option<f64>,
    pub(super) facts: Vec<Fact>,
    pub(super) tiles: Vec<Tile>,
    pub(super) sections: Vec<Section>,
    /// `terminus top --json`'s document over the same interval.
    pub(super) live: Option<serde_json::Value>,
}

/// A label and its figure.
#[derive(Debug, Serialize)]
pub(super) struct Fact {
    pub(super) label: String,
    pub(super) cell: Cell,
}

/// A headline figure, with smaller ones under it.
#[derive(Debug, Serialize)]
pub(super) struct Tile {
    pub(super) label: &'static str,
    pub(super) cell: Cell,
    pub(super) sub: Vec<Fact>,
}

/// A titled table; without rows, a line saying why.
#[derive(Debug, Serialize)]
pub(super) struct Section {
    pub(super) id: &'static str,
    pub(super) title: &'static str,
    pub(super) note: Option<String>,
    pub(super) cols: Vec<&'static str>,
    pub(super) rows: Vec<Vec<Cell>>,
    pub(super) empty: String,
    pub(super) facts: Vec<Fact>,
}

/// One figure or piece of text, formatted. A figure names its source: `m` the series it
/// is (`data-metric`), `r` the series it is the per-second change of (`data-rate`), or
/// `o` the series it is computed from over the interval (`data-of`: quantiles, shares).
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Cell {
    /// The text shown.
    pub(super) t: String,
    /// The value, unformatted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) v: Option<f64>,
    /// How `t` was formatted from `v` (`data-unit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) u: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) m: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) r: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) o: Option<String>,
    /// The label of `m` whose value `t` is (`data-label`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) l: Option<&'static str>,
    /// A class: `up`, `down`, `bad`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) k: Option<&'static str>,
}

impl Cell {
    pub(super) fn text(t: impl Into<String>) -> Self {
        Cell {
            t: t.into(),
            ..Cell::default()
        }
    }

    /// A value computed over the interval from `of`.
    pub(super) fn derived(v: Option<f64>, unit: Unit, of: impl Into<String>) -> Self {
        Cell {
            t: unit.format(v),
            v,
            u: Some(unit.name()),
            o: Some(of.into()),
            ..Cell::default()
        }
    }

    pub(super) fn class(mut self, k: &'static str) -> Self {
        self.k = Some(k);
        self
    }
}

/// How a value is shown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Unit {
    /// A whole number, thousands separated by commas.
    Count,
    /// A whole number that names something (an epoch), not counted: no separators.
    Number,
    /// Two decimals.
    Decimal,
    /// Seconds shown as milliseconds, three decimals.
    Ms,
    /// A ratio shown as a percentage, one decimal.
    Percent,
    /// Requests per batch, two decimals.
    Fill,
    /// Per second, one decimal.
    PerSecond,
    /// Unix seconds shown as a UTC date and time to the minute.
    Date,
    /// 1 `up`, 0 `down`.
    Health,
}

impl Unit {
    /// `data-unit`: what the page's test reads a figure back by.
    pub(super) fn name(self) -> &'static str {
        match self {
            Unit::Count => "n",
            Unit::Number => "int",
            Unit::Decimal => "dec",
            Unit::Ms => "ms",
            Unit::Percent => "%",
            Unit::Fill => "x",
            Unit::PerSecond => "/s",
            Unit::Date => "date",
            Unit::Health => "up",
        }
    }

    pub(super) fn format(self, v: Option<f64>) -> String {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            return "–".to_owned();
        };
        match self {
            Unit::Count => grouped(v, 0),
            Unit::Number => format!("{v:.0}"),
            Unit::Decimal | Unit::Fill => grouped(v, 2),
            Unit::Ms => grouped(v * 1e3, 3),
            Unit::Percent => format!("{}%", grouped(v * 100.0, 1)),
            Unit::PerSecond => grouped(v, 1),
            Unit::Date => date(v as i64, false),
            Unit::Health => if v >= 1.0 { "up" } else { "down" }.to_owned(),
        }
    }
}

/// `v` with `places` decimals, its whole part's thousands separated by commas.
fn grouped(v: f64, places: usize) -> String {
    let text = format!("{:.*}", places, v.abs());
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    let mut out = String::new();
    if v < 0.0 && text.bytes().any(|b| b.is_ascii_digit() && b != b'0') {
        out.push('-');
    }
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(fraction);
    }
    out
}

/// Unix seconds as `YYYY-MM-DD HH:MM UTC`, or `HH:MM:SS` with `seconds` (the proleptic
/// Gregorian calendar, by the access log's `civil_from_days`).
pub(super) fn date(unix: i64, seconds: bool) -> String {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    let (year, month, day) = crate::logs::access::civil_from_days(days);
    let mut out = format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    );
    if seconds {
        let _ = write!(out, ":{:02}", secs % 60);
    }
    out.push_str(" UTC");
    out
}

/// A duration as the largest two units (`3 d 4 h`, `2 min 5 s`).
pub(super) fn uptime(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `s` escaped for a page's text or a quoted attribute value (one escaper for every
/// page terminus writes).
pub(super) fn escape(s: &str) -> String {
    terminus_http::html_escaped(s)
}

/// A cell as an element `tag` of class `class` (and the cell's own), as the page's
/// script makes it (`cell()` there).
fn cell_html(out: &mut String, tag: &str, class: Option<&str>, c: &Cell) {
    let _ = write!(out, "<{tag}");
    let classes: Vec<&str> = class.into_iter().chain(c.k).collect();
    if !classes.is_empty() {
        let _ = write!(out, " class=\"{}\"", escape(&classes.join(" ")));
    }
    for (name, value) in [
        ("data-metric", c.m.as_deref()),
        ("data-rate", c.r.as_deref()),
        ("data-of", c.o.as_deref()),
        ("data-label", c.l),
        ("data-unit", c.u),
    ] {
        if let Some(v) = value {
            let _ = write!(out, " {name}=\"{}\"", escape(v));
        }
    }
    let _ = write!(out, ">{}</{tag}>", escape(&c.t));
}

/// The page with `p` as its first view.
pub(super) fn document(p: &Page) -> String {
    TEMPLATE.replacen("<!--page-->", &html(p), 1)
}

/// The page's first view: what the script's `render()` makes of the same model.
fn html(p: &Page) -> String {
    let mut out = String::with_capacity(32 * 1024);
    out.push_str("<header><h1>terminus status</h1><p class=\"facts\">");
    for f in &p.facts {
        let _ = write!(out, "<span class=\"fact\">{} ", escape(&f.label));
        cell_html(&mut out, "b", None, &f.cell);
        out.push_str("</span>");
    }
    out.push_str("</p></header><div class=\"tiles\">");
    for t in &p.tiles {
        let _ = write!(
            out,
            "<div class=\"tile\"><div class=\"label\">{}</div>",
            escape(t.label)
        );
        cell_html(&mut out, "div", Some("big"), &t.cell);
        out.push_str("<p class=\"sub\">");
        for f in &t.sub {
            out.push_str("<span class=\"fact\">");
            cell_html(&mut out, "b", None, &f.cell);
            let _ = write!(out, " {}</span>", escape(&f.label));
        }
        out.push_str("</p></div>");
    }
    out.push_str("</div><div class=\"sections\">");
    for s in &p.sections {
        let _ = write!(
            out,
            "<section id=\"{}\"><h2>{}",
            escape(s.id),
            escape(s.title)
        );
        if let Some(note) = &s.note {
            let _ = write!(out, " <small>{}</small>", escape(note));
        }
        out.push_str("</h2>");
        if s.rows.is_empty() {
            let _ = write!(out, "<p class=\"empty\">{}</p>", escape(&s.empty));
        } else {
            out.push_str("<table><thead><tr>");
            // A column of figures is right-aligned, its head too (as the first row says).
            for (i, c) in s.cols.iter().enumerate() {
                let figures = s.rows[0].get(i).is_some_and(|c| c.u.is_some());
                let class = if figures { " class=\"num\"" } else { "" };
                let _ = write!(out, "<th{class}>{}</th>", escape(c));
            }
            out.push_str("</tr></thead><tbody>");
            for row in &s.rows {
                out.push_str("<tr>");
                for c in row {
                    cell_html(&mut out, "td", None, c);
                }
                out.push_str("</tr>");
            }
            out.push_str("</tbody></table>");
        }
        if !s.facts.is_empty() {
            out.push_str("<p class=\"facts\">");
            for f in &s.facts {
                let _ = write!(out, "<span class=\"fact\">{} ", escape(&f.label));
                cell_html(&mut out, "b", None, &f.cell);
                out.push_str("</span>");
            }
            out.push_str("</p>");
        }
        out.push_str("</section>");
    }
    out.push_str("</div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_durations_and_numbers_are_formatted() {
        assert_eq!(date(0, false), "1970-01-01 00:00 UTC");
        assert_eq!(date(1_767_225_600, false), "2026-01-01 00:00 UTC");
        assert_eq!(
            date(951_782_400 + 3600 + 125, true),
            "2000-02-29 01:02:05 UTC"
        );
        assert_eq!(date(-1, true), "1969-12-31 23:59:59 UTC");
        assert_eq!(uptime(Duration::from_secs(3725)), "1 h 2 min");
        assert_eq!(grouped(999.0, 0), "999");
        assert_eq!(grouped(1000.0, 0), "1,000");
        assert_eq!(grouped(-1234.5, 1), "-1,234.5");
        assert_eq!(grouped(-0.01, 1), "0.0");
        assert_eq!(Unit::Percent.format(Some(0.1234)), "12.3%");
        assert_eq!(Unit::Ms.format(Some(0.000_25)), "0.250");
        assert_eq!(Unit::Count.format(None), "–");
        assert_eq!(Unit::Number.format(Some(83_141.0)), "83141");
        assert_eq!(Unit::Count.format(Some(f64::NAN)), "–");
        assert_eq!(Unit::Health.format(Some(0.0)), "down");
    }

    #[test]
    fn escapes_make_text_and_quoted_attributes_safe() {
        assert_eq!(
            escape("<a href=\"x\" title='y'>&amp;</a>"),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;amp;&lt;/a&gt;"
        );
        let mut out = String::new();
        let cell = Cell {
            m: Some("x{a=\"<b>\"}".into()),
            u: Some("n"),
            ..Cell::text("</td><script>")
        };
        cell_html(&mut out, "td", Some("big"), &cell.class("up"));
        assert_eq!(
            out,
            "<td class=\"big up\" data-metric=\"x{a=&quot;&lt;b&gt;&quot;}\" data-unit=\"n\">&lt;/td&gt;&lt;script&gt;</td>"
        );
    }

    /// The template has one place for the first view, and the policy names both of its
    /// inline parts by hash: nothing else runs, not even other inline script.
    #[test]
    fn the_policy_names_the_pages_own_script_and_style() {
        assert_eq!(TEMPLATE.matches("<!--page-->").count(), 1);
        assert_eq!(TEMPLATE.matches("<script>").count(), 1);
        let csp = content_security_policy();
        assert!(
            csp.starts_with("default-src 'none'; script-src 'sha256-"),
            "{csp}"
        );
        assert!(csp.contains("; style-src 'sha256-"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
    }
}
