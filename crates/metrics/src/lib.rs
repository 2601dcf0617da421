//! Prometheus series that carry their own name and help and render themselves.
//!
//! Each crate owns its series: the engine its per-operation counters, the TLS crate its
//! byte counters, the server its connection counters. A series is declared once with
//! its name, help and label values, updated through methods (never a public atomic), and
//! written by [`Render::render`] into an [`Exposition`], the text format `GET /metrics`
//! serves. Label values are fixed when the series is made, so rendering allocates
//! nothing per sample and the label set cannot grow without bound.
//!
//! Labels are written by [`Labels`] alone, from (name, value) pairs, each value escaped
//! as the text format requires (`\\`, `\"`, `\n`): a value holding a quote or a
//! newline (an operator's upstream or tenant name) stays one label of one series and
//! cannot add series of its own.

use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The Prometheus text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    /// The family whose header was written last.
    family: String,
}

impl Exposition {
    /// An empty page.
    pub fn new() -> Self {
        Self {
            text: String::with_capacity(16 * 1024),
            family: String::new(),
        }
    }

    /// The `# HELP` and `# TYPE` lines of a series. A family spread over several series
    /// objects (one per upstream server, say) is rendered by rendering them one after
    /// the other: the header is written once, before the first.
    pub fn header(&mut self, name: &str, kind: Kind, help: &str) {
        if self.family == name {
            return;
        }
        self.family.clear();
        self.family.push_str(name);
        let _ = writeln!(
            self.text,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.name()
        );
    }

    /// One sample, with `labels` (or [`Labels::NONE`]).
    pub fn sample(&mut self, name: &str, labels: &Labels, value: impl Display) {
        if labels.0.is_empty() {
            let _ = writeln!(self.text, "{name} {value}");
        } else {
            let _ = writeln!(self.text, "{name}{{{}}} {value}", labels.0);
        }
    }

    /// A whole family: its header, then a sample for each `(labels, value)`.
    pub fn family<V: Display>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, V)>,
    ) {
        self.header(name, kind, help);
        for (labels, value) in samples {
            self.sample(name, &labels, value);
        }
    }

    /// The page's text.
    pub fn into_text(self) -> String {
        self.text
    }
}

/// The label set of a sample, as written between its braces: `name="value"` pairs, each
/// value escaped (backslash, double quote and newline, as the text exposition format
/// says). The only way a label reaches the page, so no caller can forget to escape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(String);

impl Labels {
    /// No labels.
    pub const NONE: Labels = Labels(String::new());

    /// The labels `pairs`, in order.
    pub fn of<const N: usize>(pairs: [(&str, &str); N]) -> Self {
        pairs
            .into_iter()
            .fold(Labels::NONE, |labels, (name, value)| {
                labels.with(name, value)
            })
    }

    /// These labels, then `name="value"`. `name` is a label name of the code's (letters,
    /// digits and `_`), never an operator's.
    pub fn with(mut self, name: &str, value: impl Display) -> Self {
        debug_assert!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{name:?} is not a label name"
        );
        if !self.0.is_empty() {
            self.0.push(',');
        }
        self.0.push_str(name);
        self.0.push_str("=\"");
        let _ = write!(Escaping(&mut self.0), "{value}");
        self.0.push('"');
        self
    }

    /// These labels, then `more`'s.
    pub fn and(mut self, more: &Labels) -> Self {
        if !self.0.is_empty() && !more.0.is_empty() {
            self.0.push(',');
        }
        self.0.push_str(&more.0);
        self
    }

    /// The text between the braces (`a="x",b="y"`), empty for none.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Writes what it is given as a label value's text: `\`, `"` and a newline escaped.
struct Escaping<'a>(&'a mut String);

impl std::fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for c in s.chars() {
            match c {
                '\\' => self.0.push_str("\\\\"),
                '"' => self.0.push_str("\\\""),
                '\n' => self.0.push_str("\\n"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// What a series is, for its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that only goes up.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Anything that writes series into an exposition.
pub trait Render {
    /// Appends this metric's series to `out`.
    fn render(&self, out: &mut Exposition);
}

/// The name and help of a series.
#[derive(Debug, Clone, Copy)]
pub struct Desc {
    /// The series name.
    pub name: &'static str,
    /// The `# HELP` text.
    pub help: &'static str,
}

/// A count that only goes up.
#[derive(Debug)]
pub struct Counter {
    desc: Desc,
    value: AtomicU64,
}

impl Counter {
    /// A counter at zero.
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            desc: Desc { name, help },
            value: AtomicU64::new(0),
        }
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Render for Counter {
    fn render(&self, out: &mut Exposition) {
        out.header(self.desc.name, Kind::Counter, self.desc.help);
        out.sample(self.desc.name, &Labels::NONE, self.get());
    }
}

/// A value that goes up and down.
#[derive(Debug)]
pub struct Gauge {
    desc: Desc,
    value: AtomicI64,
}

impl Gauge {
    /// A gauge at zero.
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            desc: Desc { name, help },
            value: AtomicI64::new(0),
        }
    }

    /// Adds `n` (negative to go down).
    pub fn add(&self, n: i64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Render for Gauge {
    fn render(&self, out: &mut Exposition) {
        out.header(self.desc.name, Kind::Gauge, self.desc.help);
        out.sample(self.desc.name, &Labels::NONE, self.get());
    }
}

/// One series per value of a label, the values fixed when it is made: a counter
/// (`Kind::Counter`) or a gauge (`Kind::Gauge`). `scale` divides what is shown (1e6 for a
/// sum kept in microseconds and shown in seconds).
#[derive(Debug)]
pub struct Labelled<const N: usize> {
    desc: Desc,
    kind: Kind,
    /// `label="value"` (and any constant labels after it) per series.
    labels: [Labels; N],
    values: [AtomicI64; N],
    scale: f64,
}

impl<const N: usize> Labelled<N> {
    /// A counter per label set in `labels`.
    pub fn counter(name: &'static str, help: &'static str, labels: [Labels; N]) -> Self {
        Self::new(Desc { name, help }, Kind::Counter, labels)
    }

    /// A gauge per label set in `labels`.
    pub fn gauge(name: &'static str, help: &'static str, labels: [Labels; N]) -> Self {
        Self::new(Desc { name, help }, Kind::Gauge, labels)
    }

    fn new(desc: Desc, kind: Kind, labels: [Labels; N]) -> Self {
        Self {
            desc,
            kind,
            labels,
            values: std::array::from_fn(|_| AtomicI64::new(0)),
            scale: 1.0,
        }
    }

    /// Shows each value divided by `scale`.
    pub fn scaled(mut self, scale: f64) -> Self {
        self.scale = scale;
        self
    }

    /// Adds one to the `i`th series.
    pub fn inc(&self, i: usize) {
        self.add(i, 1);
    }

    /// Adds `n` to the `i`th series.
    pub fn add(&self, i: usize, n: i64) {
        self.values[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Sets the `i`th series to `n` (a gauge that says a state, not a count).
    pub fn set(&self, i: usize, n: i64) {
        self.values[i].store(n, Ordering::Relaxed);
    }

    /// The `i`th series' value.
    pub fn get(&self, i: usize) -> i64 {
        self.values[i].load(Ordering::Relaxed)
    }
}

impl<const N: usize> Render for Labelled<N> {
    fn render(&self, out: &mut Exposition) {
        out.header(self.desc.name, self.kind, self.desc.help);
        for (labels, value) in self.labels.iter().zip(&self.values) {
            let value = value.load(Ordering::Relaxed);
            if self.scale == 1.0 {
                out.sample(self.desc.name, labels, value);
            } else {
                out.sample(self.desc.name, labels, value as f64 / self.scale);
            }
        }
    }
}

/// `label="value"` for each value, then `rest`: the label sets of a [`Labelled`] series.
pub fn label_values<const N: usize>(label: &str, values: [&str; N], rest: &Labels) -> [Labels; N] {
    values.map(|v| Labels::NONE.with(label, v).and(rest))
}

/// The buckets of one histogram, lock-free; observations in seconds (durations) or plain
/// numbers (sizes), as the bounds say.
#[derive(Debug)]
pub struct Buckets {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum of the values, in the observed unit (an f64's bits): whole µs lost up to a
    /// µs per observation, and parts recorded apart (a handshake's phases) did not add up
    /// to their whole (1% short for a 280 µs handshake of eight phases).
    sum: AtomicU64,
}

impl Buckets {
    /// Empty buckets with these upper bounds.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records a duration, in the histogram's unit (seconds).
    pub fn observe_duration(&self, d: Duration) {
        self.observe_value(d.as_secs_f64());
    }

    /// Records a value, in the bounds' unit.
    pub fn observe(&self, value: u64) {
        self.observe_value(value as f64);
    }

    fn observe_value(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Writes the histogram's series under `name` with `labels` (no header: several
    /// label sets share one).
    pub fn render(&self, out: &mut Exposition, name: &str, labels: &Labels) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n.load(Ordering::Relaxed);
            out.sample(&bucket, &labels.clone().with("le", bound), cumulative);
        }
        out.sample(&bucket, &labels.clone().with("le", "+Inf"), self.count());
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        out.sample(&format!("{name}_sum"), labels, sum);
        out.sample(&format!("{name}_count"), labels, self.count());
    }
}

/// A histogram per label set (one, unlabelled, for `N = 1` and an empty label).
#[derive(Debug)]
pub struct Histograms<const N: usize> {
    desc: Desc,
    labels: [Labels; N],
    buckets: [Buckets; N],
}

impl<const N: usize> Histograms<N> {
    /// A histogram per label value in `labels`.
    pub fn new(
        name: &'static str,
        help: &'static str,
        bounds: &'static [f64],
        labels: [Labels; N],
    ) -> Self {
        Self {
            desc: Desc { name, help },
            labels,
            buckets: std::array::from_fn(|_| Buckets::new(bounds)),
        }
    }

    /// The `i`th series' buckets.
    pub fn get(&self, i: usize) -> &Buckets {
        &self.buckets[i]
    }
}

impl<const N: usize> Render for Histograms<N> {
    fn render(&self, out: &mut Exposition) {
        out.header(self.desc.name, Kind::Histogram, self.desc.help);
        for (labels, buckets) in self.labels.iter().zip(&self.buckets) {
            buckets.render(out, self.desc.name, labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &dyn Render) -> String {
        let mut out = Exposition::new();
        r.render(&mut out);
        out.into_text()
    }

    #[test]
    fn counters_and_gauges_render_their_header_and_value() {
        let c = Counter::new("t_total", "Things.");
        c.add(3);
        c.inc();
        assert_eq!(
            text(&c),
            "# HELP t_total Things.\n# TYPE t_total counter\nt_total 4\n"
        );
        let g = Gauge::new("t_open", "Open.");
        g.add(2);
        g.add(-1);
        assert!(text(&g).ends_with("# TYPE t_open gauge\nt_open 1\n"));
    }

    #[test]
    fn labelled_series_render_every_label_value() {
        let l = Labelled::counter(
            "t_total",
            "T.",
            label_values("op", ["a", "b"], &Labels::of([("backend", "x")])),
        );
        l.inc(1);
        let t = text(&l);
        assert!(t.contains("t_total{op=\"a\",backend=\"x\"} 0\n"), "{t}");
        assert!(t.contains("t_total{op=\"b\",backend=\"x\"} 1\n"), "{t}");
        let s = Labelled::counter(
            "t_seconds_sum",
            "S.",
            label_values("op", ["a"], &Labels::NONE),
        )
        .scaled(1e6);
        s.add(0, 1_500_000);
        assert!(text(&s).contains("t_seconds_sum{op=\"a\"} 1.5\n"));
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        static BOUNDS: &[f64] = &[0.001, 0.01];
        let h = Histograms::new("t_seconds", "T.", BOUNDS, [Labels::NONE]);
        h.get(0).observe_duration(Duration::from_micros(500));
        h.get(0).observe_duration(Duration::from_millis(5));
        h.get(0).observe_duration(Duration::from_secs(1));
        let t = text(&h);
        for line in [
            "t_seconds_bucket{le=\"0.001\"} 1\n",
            "t_seconds_bucket{le=\"0.01\"} 2\n",
            "t_seconds_bucket{le=\"+Inf\"} 3\n",
            "t_seconds_sum 1.0055\n",
            "t_seconds_count 3\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
        static SIZES: &[f64] = &[1.0, 2.0];
        let sizes = Histograms::new(
            "t_size",
            "S.",
            SIZES,
            label_values("op", ["a"], &Labels::NONE),
        );
        sizes.get(0).observe(2);
        let t = text(&sizes);
        assert!(t.contains("t_size_bucket{op=\"a\",le=\"1\"} 0\n"), "{t}");
        assert!(t.contains("t_size_sum{op=\"a\"} 2\n"), "{t}");
    }

    #[test]
    fn label_values_are_escaped_so_they_stay_one_series() {
        let name = "a\"} 1\nevil{x=\"\\";
        let labels = Labels::of([("upstream", name)]).with("n", 2);
        assert_eq!(
            labels.as_str(),
            "upstream=\"a\\\"} 1\\nevil{x=\\\"\\\\\",n=\"2\""
        );
        let mut out = Exposition::new();
        out.sample("t_total", &labels, 1);
        let t = out.into_text();
        assert_eq!(t.lines().count(), 1, "{t}");
        assert!(t.ends_with("\",n=\"2\"} 1\n"), "{t}");
    }
}
