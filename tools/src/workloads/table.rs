//! The benchmark table: one row per figure, with the baseline measured in the same run,
//! their ratio, and the target as met / not met (never an assertion).
//!
//! Invariant: a row shows only figures it was given; a row that could not be measured says
//! why instead of showing a number.

/// One row.
#[derive(Debug, Clone)]
pub struct Row {
    pub group: &'static str,
    pub name: String,
    /// The figure, or why there is none.
    pub value: Result<f64, String>,
    pub unit: &'static str,
    /// Baseline name and figure (same unit).
    pub baseline: Option<(String, f64)>,
    /// Target text and whether the figure meets it.
    pub target: Option<(String, bool)>,
}

impl Row {
    pub fn new(
        group: &'static str,
        name: impl Into<String>,
        value: f64,
        unit: &'static str,
    ) -> Row {
        Row {
            group,
            name: name.into(),
            value: Ok(value),
            unit,
            baseline: None,
            target: None,
        }
    }

    pub fn skipped(group: &'static str, name: impl Into<String>, why: impl Into<String>) -> Row {
        Row {
            group,
            name: name.into(),
            value: Err(why.into()),
            unit: "",
            baseline: None,
            target: None,
        }
    }

    pub fn baseline(mut self, name: impl Into<String>, value: f64) -> Row {
        self.baseline = Some((name.into(), value));
        self
    }

    pub fn target(mut self, text: impl Into<String>, met: bool) -> Row {
        self.target = Some((text.into(), met));
        self
    }
}

/// A number with a sensible number of digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        format!("{:.3e}", v)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn with_unit(v: f64, unit: &str) -> String {
    if unit.is_empty() {
        num(v)
    } else {
        format!("{} {unit}", num(v))
    }
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| group | benchmark | median | baseline (same run) | ratio | target | met |\n\
         |---|---|---:|---|---:|---|---|\n",
    );
    for r in rows {
        let (value, base, ratio) = match &r.value {
            Err(why) => (format!("skipped: {why}"), String::new(), String::new()),
            Ok(v) => match &r.baseline {
                Some((name, b)) => (
                    with_unit(*v, r.unit),
                    format!("{name}: {}", with_unit(*b, r.unit)),
                    if *b > 0.0 {
                        format!("{}x", num(v / b))
                    } else {
                        "-".into()
                    },
                ),
                None => (with_unit(*v, r.unit), "-".into(), "-".into()),
            },
        };
        let (target, met) = match (&r.target, &r.value) {
            (Some((t, m)), Ok(_)) => (t.clone(), if *m { "met" } else { "NOT met" }.to_string()),
            (Some((t, _)), Err(_)) => (t.clone(), "-".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.group, r.name, value, base, ratio, target, met
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_ratio_to_baseline_and_target_verdict() {
        let t = markdown(&[
            Row::new("1", "pair", 300.0, "ns")
                .baseline("glibc", 15.0)
                .target("<= 100 ns", false),
            Row::new("2", "fp", 1.5, "ns").target("<= 3 ns", true),
        ]);
        assert!(
            t.contains("| 1 | pair | 300 ns | glibc: 15.0 ns | 20.0x | <= 100 ns | NOT met |"),
            "{t}"
        );
        assert!(
            t.contains("| 2 | fp | 1.50 ns | - | - | <= 3 ns | met |"),
            "{t}"
        );
    }

    #[test]
    fn an_unmeasured_row_says_why_and_gives_no_verdict() {
        let mut r = Row::skipped("1", "shim pair", "libcushim.so not built");
        r = r.target("<= 100 ns", true);
        let t = markdown(&[r]);
        assert!(t.contains("skipped: libcushim.so not built"), "{t}");
        assert!(t.trim_end().ends_with("| <= 100 ns | - |"), "{t}");
    }
}
