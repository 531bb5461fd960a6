//! Plain-text tables for the benchmarks' printouts (`hca_bench`, `lease_bench`, `cargo xtask bench boot`).

/// `headers` and `rows` as columns joined by ` | ` under a `-|-` rule; the first `left` columns are aligned
/// left, the rest right. Every row has one cell per header.
pub fn render(headers: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([headers[i].chars().count()]).max().unwrap_or(0))
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let pad = " ".repeat(w.saturating_sub(c.chars().count()));
                if i < left { format!("{c}{pad}") } else { format!("{pad}{c}") }
            })
            .collect();
        format!("{}\n", padded.join(" | ").trim_end())
    };
    let mut out = line(&mut headers.iter().copied());
    out.push_str(&format!("{}\n", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("-|-")));
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_are_padded_and_aligned() {
        let rows = vec![vec!["a".to_string(), "1".to_string()], vec!["long".to_string(), "22".to_string()]];
        assert_eq!(super::render(&["name", "n"], &rows, 1), "name |  n\n-----|---\na    |  1\nlong | 22\n");
    }
}
