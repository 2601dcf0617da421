//! Reading `GET /metrics` back: the Prometheus text a running terminus serves, parsed
//! into samples, summed over label sets, and its histograms turned into rates and
//! quantiles between two scrapes (what `terminus top` shows).

use std::collections::BTreeMap;

/// One line of the exposition.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn matches(&self, name: &str, filter: &[(&str, &str)]) -> bool {
        self.name == name && filter.iter().all(|(n, v)| self.label(n) == Some(v))
    }
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    samples: Vec<Sample>,
}

impl Scrape {
    /// Parses the text exposition; lines it cannot read are skipped.
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(parse_line)
            .collect();
        Self { samples }
    }

    /// The sum of `name` over the label sets that match `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.matches(name, filter))
            .map(|s| s.value)
            .sum()
    }

    /// The sums of `name` over label sets matching `filter`, by the value of `label`.
    pub fn by(&self, name: &str, label: &str, filter: &[(&str, &str)]) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.matches(name, filter)) {
            if let Some(v) = s.label(label) {
                *out.entry(v.to_owned()).or_insert(0.0) += s.value;
            }
        }
        out
    }

    /// The distinct values of `labels` on `name`'s samples that match `filter`, in the
    /// order the page has them (a sample without one of them is left out): the rows of a
    /// table with a row per upstream server, say.
    pub fn label_sets(
        &self,
        name: &str,
        labels: &[&str],
        filter: &[(&str, &str)],
    ) -> Vec<Vec<String>> {
        let mut out: Vec<Vec<String>> = Vec::new();
        for s in self.samples.iter().filter(|s| s.matches(name, filter)) {
            let Some(values) = labels
                .iter()
                .map(|l| s.label(l).map(str::to_owned))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            if !out.contains(&values) {
                out.push(values);
            }
        }
        out
    }

    /// Whether the page has a sample of `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// The histogram `name`, its label sets matching `filter` merged.
    pub fn histogram(&self, name: &str, filter: &[(&str, &str)]) -> Histogram {
        // Bounds are non-negative, whose bit patterns order as their values (+Inf last).
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        let bucket = format!("{name}_bucket");
        for s in self.samples.iter().filter(|s| s.matches(&bucket, filter)) {
            // `+Inf` parses as infinity.
            if let Some(le) = s.label("le").and_then(|le| le.parse::<f64>().ok()) {
                buckets.entry(le.to_bits()).or_insert((le, 0.0)).1 += s.value;
            }
        }
        let buckets: Vec<(f64, f64)> = buckets.into_values().collect();
        Histogram {
            buckets,
            count: self.sum(&format!("{name}_count"), filter),
            sum: self.sum(&format!("{name}_sum"), filter),
        }
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `a="x",b="y"`, each value unescaped as the text format escapes it (`\\`, `\"`, `\n`;
/// terminus_metrics::Labels writes them): an operator's name holding a quote, a comma
/// or a brace reads back as written.
fn parse_labels(mut rest: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    // `\\` and `\"`; a backslash before anything else is kept, as
                    // Prometheus reads it.
                    c @ ('\\' | '"') => value.push(c),
                    c => {
                        value.push('\\');
                        value.push(c);
                    }
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.push((name.trim_start_matches(',').to_owned(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// Cumulative buckets (upper bound, count at or below it), a count and a sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    buckets: Vec<(f64, f64)>,
    /// Observations.
    pub count: f64,
    /// Their sum.
    pub sum: f64,
}

impl Histogram {
    /// What was observed after `earlier` (a scrape of the same series before this one).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, n)| *n)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, n)| (le, (n - before(le)).max(0.0)))
                .collect(),
            count: (self.count - earlier.count).max(0.0),
            sum: (self.sum - earlier.sum).max(0.0),
        }
    }

    /// The mean observation; `None` without observations.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The `q` quantile (0 to 1), interpolated linearly inside its bucket as
    /// Prometheus's `histogram_quantile` does; `None` without observations. In the
    /// last, unbounded bucket it is that bucket's lower bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let mut lower = (0.0, 0.0);
        for &(le, n) in &self.buckets {
            if n >= rank {
                if le.is_infinite() {
                    return Some(lower.0);
                }
                let within = n - lower.1;
                let part = if within > 0.0 {
                    (rank - lower.1) / within
                } else {
                    1.0
                };
                return Some(lower.0 + (le - lower.0) * part);
            }
            lower = (le, n);
        }
        Some(lower.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP t_seconds T.
# TYPE t_seconds histogram
t_seconds_bucket{phase="a",le="0.001"} 10
t_seconds_bucket{phase="a",le="0.01"} 90
t_seconds_bucket{phase="a",le="+Inf"} 100
t_seconds_sum{phase="a"} 0.5
t_seconds_count{phase="a"} 100
t_seconds_bucket{phase="b",le="0.001"} 0
t_seconds_bucket{phase="b",le="0.01"} 0
t_seconds_bucket{phase="b",le="+Inf"} 0
t_seconds_sum{phase="b"} 0
t_seconds_count{phase="b"} 0
c_total{op="x",backend="scalar"} 3
c_total{op="y",backend="scalar"} 4
up 1
"#;

    #[test]
    fn samples_sum_and_group_by_label() {
        let s = Scrape::parse(PAGE);
        assert_eq!(s.sum("c_total", &[]), 7.0);
        assert_eq!(s.sum("c_total", &[("op", "y")]), 4.0);
        assert_eq!(s.sum("up", &[]), 1.0);
        let by = s.by("c_total", "op", &[("backend", "scalar")]);
        assert_eq!(
            by.into_iter().collect::<Vec<_>>(),
            [("x".into(), 3.0), ("y".into(), 4.0)]
        );
    }

    #[test]
    fn label_sets_are_the_distinct_values_in_page_order() {
        let s = Scrape::parse(PAGE);
        assert_eq!(
            s.label_sets("c_total", &["backend", "op"], &[]),
            [vec!["scalar", "x"], vec!["scalar", "y"]]
        );
        assert_eq!(s.label_sets("c_total", &["backend"], &[]), [vec!["scalar"]]);
        assert!(s.label_sets("c_total", &["nope"], &[]).is_empty());
        assert_eq!(
            s.label_sets("t_seconds_count", &["phase"], &[]),
            [vec!["a"], vec!["b"]]
        );
        assert!(s.has("up") && !s.has("down"));
    }

    #[test]
    fn escaped_label_values_read_back_as_written() {
        let name = "a\"},b=\"x\\y\nz";
        let labels = terminus_metrics::Labels::of([("upstream", name), ("server", "s")]);
        let mut out = terminus_metrics::Exposition::new();
        out.sample("t_total", &labels, 2);
        out.sample(
            "t_total",
            &terminus_metrics::Labels::of([("upstream", "b")]),
            3,
        );
        let s = Scrape::parse(&out.into_text());
        assert_eq!(s.sum("t_total", &[("upstream", name)]), 2.0);
        assert_eq!(s.sum("t_total", &[]), 5.0);
        assert_eq!(
            s.label_sets("t_total", &["upstream", "server"], &[]),
            [vec![name.to_owned(), "s".to_owned()]]
        );
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let s = Scrape::parse(PAGE);
        let h = s.histogram("t_seconds", &[("phase", "a")]);
        assert_eq!(h.count, 100.0);
        // Rank 50 is 40 of the 80 in (0.001, 0.01]: halfway.
        assert!((h.quantile(0.5).unwrap() - 0.0055).abs() < 1e-12);
        assert!((h.quantile(0.05).unwrap() - 0.0005).abs() < 1e-12);
        // In +Inf: the last finite bound.
        assert_eq!(h.quantile(0.99), Some(0.01));
        assert_eq!(h.mean(), Some(0.005));
        assert_eq!(
            s.histogram("t_seconds", &[("phase", "b")]).quantile(0.5),
            None
        );
        // Merged label sets.
        assert_eq!(s.histogram("t_seconds", &[]).count, 100.0);
    }

    #[test]
    fn a_histogram_since_an_earlier_scrape_is_the_difference() {
        let later = Scrape::parse(PAGE).histogram("t_seconds", &[("phase", "a")]);
        let earlier = Scrape::parse(
            &PAGE
                .replace("} 90\n", "} 10\n")
                .replace("} 100\n", "} 20\n"),
        )
        .histogram("t_seconds", &[("phase", "a")]);
        let d = later.since(&earlier);
        assert_eq!(d.count, 80.0);
        // All 80 new ones in (0.001, 0.01].
        assert!((d.quantile(0.5).unwrap() - 0.0055).abs() < 1e-12);
    }
}
