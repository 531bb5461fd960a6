//! A stand-in for `qemu-system-x86_64` in tests of this crate and of the boot scenarios: a shell script that
//! runs the shell code passed as a `-kernel` boot's `-append` string (exit 99 when there is none).

use std::io;
use std::path::Path;

const SCRIPT: &str = "#!/bin/sh\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = -append ]; then eval \"$2\"; exit $?; fi\n  shift\ndone\nexit 99\n";

/// Writes the fake QEMU script to `path` and makes it executable.
pub fn write_fake_qemu(path: &Path) -> io::Result<()> {
    std::fs::write(path, SCRIPT)?;
    let mut perms = std::fs::metadata(path)?.permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms)
}
