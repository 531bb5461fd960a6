//! Links the image with its linker script when building for the bare-metal target; host builds (clippy,
//! `cargo test --workspace`) get a plain stub binary instead.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = std::path::Path::new(&dir).join("linker.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
        println!("cargo:rustc-link-arg-bins=--no-pie");
        println!("cargo:rustc-link-arg-bins=-zmax-page-size=4096");
    }
}
