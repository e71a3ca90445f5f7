//! `tutti-bench report DIR`: the `--json` documents of a set of runs as one
//! self-contained HTML page: per run, its facts (command line, version,
//! commit, machine, time), its chart as inline SVG, and its numbers as
//! tables. No script, no stylesheet or image fetched from anywhere. The
//! page is also well-formed XML (every element closed, all text escaped),
//! so a test can parse it whole.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::plot;
use crate::schema::{AnyDocument, ReadError};

/// One file of the directory, read or not.
#[derive(Debug)]
pub struct Entry {
    /// The file.
    pub path: PathBuf,
    /// Its document, or why it is not one this build can show.
    pub doc: Result<AnyDocument, ReadError>,
}

/// The `*.json` files directly in `dir`, by name.
pub fn gather(dir: &Path) -> std::io::Result<Vec<Entry>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        out.push(Entry { doc: AnyDocument::parse(&text), path });
    }
    Ok(out)
}

/// `s` with `& < > " '` escaped for HTML text and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:70em}\
table{border-collapse:collapse;margin:0.5em 0 1em}\
td,th{border:1px solid #bbb;padding:2px 8px;text-align:left;font-size:90%}\
th{background:#eee}section{border-top:2px solid #444;margin-top:2em}\
code{background:#f4f4f4}.err{color:#a00}";

/// The whole page for `entries` (title: `title`).
pub fn html(title: &str, entries: &[Entry]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>{t}</title>\
         <style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = escape(title)
    );
    let _ = writeln!(out, "<p>{} file(s); GB = 10^9 bytes.</p>", entries.len());
    overlay_stripe(&mut out, entries);
    for e in entries {
        section(&mut out, e);
    }
    out.push_str("</body></html>\n");
    out
}

/// With two or more `stripe` runs (e.g. CPU and GPU): one chart of all.
fn overlay_stripe(out: &mut String, entries: &[Entry]) {
    let stripes: Vec<_> = entries
        .iter()
        .filter_map(|e| match &e.doc {
            Ok(AnyDocument::Stripe(d)) => Some(&d.result),
            _ => None,
        })
        .collect();
    if stripes.len() < 2 {
        return;
    }
    out.push_str("<section><h2>stripe: all runs</h2>\n");
    push_svg(out, plot::stripe::svg_many(&stripes));
    out.push_str("</section>\n");
}

fn section(out: &mut String, e: &Entry) {
    let name = e.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let doc = match &e.doc {
        Ok(d) => d,
        Err(err) => {
            let _ = writeln!(
                out,
                "<section><h2>{}</h2><p class=\"err\">skipped: {}</p></section>",
                escape(&name),
                escape(&err.to_string())
            );
            return;
        }
    };
    let _ = writeln!(out, "<section><h2>{}: <code>{}</code></h2>", escape(doc.bench()), escape(&name));
    run_table(out, doc);
    push_svg(out, plot::svg_of(doc));
    value_tables(out, &doc.to_value());
    out.push_str("</section>\n");
}

fn run_table(out: &mut String, doc: &AnyDocument) {
    // A ttft.py report has no `run`: its `config` table says where it ran.
    let Some(r) = doc.run() else { return };
    let rows = [
        ("command line", r.command_line.join(" ")),
        ("tutti version", r.tutti_version.clone()),
        ("git commit", r.git_commit.clone()),
        ("machine", format!("{} ({} CPUs)", r.hostname, r.cpus)),
        ("started", r.started_utc.clone()),
    ];
    out.push_str("<table>");
    for (k, v) in rows {
        let _ = write!(out, "<tr><th>{k}</th><td><code>{}</code></td></tr>", escape(&v));
    }
    out.push_str("</table>\n");
}

/// The chart inline (its XML declaration dropped), or why there is none.
fn push_svg(out: &mut String, svg: Result<String, plot::PlotError>) {
    match svg {
        Ok(svg) => {
            let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
            let _ = writeln!(out, "<div class=\"chart\">{body}</div>");
        }
        Err(e) => {
            let _ = writeln!(out, "<p class=\"err\">no chart: {}</p>", escape(&e.to_string()));
        }
    }
}

/// The result's scalar fields as one table, and each list of objects as a
/// table of its own (columns: the first object's keys).
fn value_tables(out: &mut String, v: &Value) {
    let Some(obj) = v.as_object() else { return };
    let skip = ["bench", "run", "schema_version"];
    out.push_str("<table>");
    for (k, x) in obj.iter().filter(|(k, x)| !skip.contains(&k.as_str()) && !is_object_list(x)) {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(&cell(x)));
    }
    out.push_str("</table>\n");
    for (k, x) in obj.iter().filter(|(_, x)| is_object_list(x)) {
        let rows = x.as_array().map_or(&[][..], Vec::as_slice);
        let cols: Vec<&String> = rows[0].as_object().map(|o| o.keys().collect()).unwrap_or_default();
        let _ = write!(out, "<h3>{}</h3><table><tr>", escape(k));
        for c in &cols {
            let _ = write!(out, "<th>{}</th>", escape(c));
        }
        out.push_str("</tr>");
        for r in rows {
            out.push_str("<tr>");
            for c in &cols {
                let _ = write!(out, "<td>{}</td>", escape(&cell(&r[c.as_str()])));
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>\n");
    }
}

fn is_object_list(v: &Value) -> bool {
    v.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_object))
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.4}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(escape(r#"<a href="x">&'</a>"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
        assert_eq!(escape("plain 1.5 GB/s"), "plain 1.5 GB/s");
    }

    #[test]
    fn cells_of_each_kind() {
        assert_eq!(cell(&serde_json::json!(1.23456789)), "1.2346");
        assert_eq!(cell(&serde_json::json!(42)), "42");
        assert_eq!(cell(&serde_json::json!(null)), "-");
        assert_eq!(cell(&serde_json::json!("cpu")), "cpu");
        assert_eq!(cell(&serde_json::json!([[100, 0.5]])), "[[100,0.5]]");
    }

    #[test]
    fn an_empty_directory_gives_no_entries() {
        let dir = std::env::temp_dir().join(format!("tutti-bench-page-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("notes.txt"), "not json").unwrap();
        assert!(gather(&dir).unwrap().is_empty());
        let page = html("t", &[]);
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
