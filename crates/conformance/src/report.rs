//! [`Report`]: each check's [`Outcome`], counted and printed.

use std::fmt;

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    /// The controller and the driver behaved as the check expects; the text
    /// says what was seen.
    Pass(String),
    /// They did not; the text says what went wrong.
    Fail(String),
    /// The check could not run here (the text says why); not a failure.
    Skip(String),
}

/// One check's name and outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckResult {
    /// Short snake_case name of the check.
    pub name: &'static str,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// The results of [`run`] on one device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The device's name (PCI address or `emu:<name>`).
    pub device: String,
    /// One entry per check, in the order they ran.
    pub results: Vec<CheckResult>,
    /// Set when the [`Options`] do not fit the device (namespace not
    /// active or formatted with metadata, scratch range outside it or too
    /// small): a mistake of the caller, not of the controller. The checks
    /// that need the range are then skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options_error: Option<String>,
    /// Set when [`Options::stop`] cut the run short: checks were skipped.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl Report {
    /// Number of checks that passed.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Pass(_)))
    }

    /// Number of checks that failed.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Fail(_)))
    }

    /// Number of checks that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skip(_)))
    }

    /// `true` when no check failed, at least one passed, the options fit
    /// the device, and the run was not interrupted.
    pub fn is_ok(&self) -> bool {
        self.failed() == 0 && self.passed() > 0 && self.options_error.is_none() && !self.interrupted
    }

    /// The outcome of the check named `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.results.iter().find(|r| r.name == name).map(|r| &r.outcome)
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.outcome)).count()
    }
}

impl fmt::Display for Report {
    /// One line per check (`pass  name: detail`), then the summary line
    /// `conformance <device>: <n> passed, <m> failed, <k> skipped`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            let (word, text) = match &r.outcome {
                Outcome::Pass(t) => ("pass", t),
                Outcome::Fail(t) => ("FAIL", t),
                Outcome::Skip(t) => ("skip", t),
            };
            writeln!(f, "{word}  {}: {text}", r.name)?;
        }
        if let Some(why) = &self.options_error {
            writeln!(f, "options: {why}")?;
        }
        if self.interrupted {
            writeln!(f, "interrupted: a stop request skipped the checks left")?;
        }
        write!(
            f,
            "conformance {}: {} passed, {} failed, {} skipped",
            self.device,
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}
