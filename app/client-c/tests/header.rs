//! The committed header `leasebox_client.h` is what cbindgen makes of `src/lib.rs` with `cbindgen.toml`: this
//! test regenerates it and fails when the two differ. To refresh the committed header after changing the ABI:
//!
//! ```text
//! LEASEBOX_BLESS=1 cargo test -p leasebox-client-c --test header
//! ```

use std::path::Path;

#[test]
fn committed_header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("cbindgen writes UTF-8");
    let path = dir.join("leasebox_client.h");
    if std::env::var_os("LEASEBOX_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("writing leasebox_client.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != fresh {
        let first = committed.lines().zip(fresh.lines()).position(|(a, b)| a != b);
        let line = first.unwrap_or_else(|| committed.lines().count().min(fresh.lines().count())) + 1;
        panic!(
            "app/client-c/leasebox_client.h is stale (first difference at line {line}: committed {:?}, generated \
             {:?}). Refresh it with\n    LEASEBOX_BLESS=1 cargo test -p leasebox-client-c --test header\nand \
             commit the result.",
            committed.lines().nth(line - 1).unwrap_or("<end>"),
            fresh.lines().nth(line - 1).unwrap_or("<end>")
        );
    }
}
