//! libibverbs loaded at run time: `dlopen("libibverbs.so.1")` once, at the first device open, and every exported
//! verb this backend calls looked up by name (`dlsym`). Nothing in the client refers to a libibverbs symbol at
//! link time, so a program, C library or Python extension built with the `verbs` feature carries no
//! `DT_NEEDED libibverbs.so.1` (the linker's `--as-needed`, which rustc passes, drops the `-libverbs` that
//! `rdma-sys` asks for) and starts on a host without rdma-core; only opening a verbs device there fails, with an
//! error naming the packages to install.
//!
//! `rdma-sys` is kept for the structure layouts (`verbs.h`) and for the three verbs that `verbs.h` defines inline
//! through the context's operations table rather than exports: `ibv_poll_cq`, `ibv_req_notify_cq` and
//! `ibv_post_send` (they call the provider through function pointers the opened context holds).
//!
//! `ibv_query_port` is the exported symbol, not `verbs.h`'s inline `___ibv_query_port`: the exported one fills
//! the older, shorter `struct _compat_ibv_port_attr`, a prefix of `struct ibv_port_attr` (state, MTUs, ...,
//! link layer), which is all the backend reads; the caller zeroes the whole structure first.
//!
//! `LEASEBOX_IBVERBS` names another file to load instead (a test uses a path that does not exist to see the
//! error a host without the library gets).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::Mutex;

use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp,
    ibv_qp_attr, ibv_qp_init_attr,
};

/// The library's file name (its soname): what `libibverbs1` installs.
pub const DEFAULT_PATH: &str = "libibverbs.so.1";
/// The environment variable that names another file to load.
pub const PATH_VAR: &str = "LEASEBOX_IBVERBS";

/// Declares [`Ibv`], one field per exported verb with its C prototype (`verbs.h`), and `resolve`, which looks
/// each up by its symbol name.
macro_rules! exported_verbs {
    ($($(#[$doc:meta])* $field:ident = $sym:literal: $ty:ty;)*) => {
        /// The exported verbs the backend calls, resolved from the loaded library.
        pub struct Ibv {
            $($(#[$doc])* pub $field: $ty,)*
        }

        fn resolve(sym: impl Fn(&str) -> Result<*mut c_void, String>) -> Result<Ibv, String> {
            Ok(Ibv {
                $($field: {
                    let p = sym($sym)?;
                    // SAFETY: `p` is the address of the exported function `$sym`, whose C prototype (`verbs.h`)
                    // is `$ty`; function and data pointers have one size on the platforms libibverbs supports.
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
                },)*
            })
        }
    };
}

exported_verbs! {
    get_device_list = "ibv_get_device_list": unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
    free_device_list = "ibv_free_device_list": unsafe extern "C" fn(*mut *mut ibv_device);
    get_device_name = "ibv_get_device_name": unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
    open_device = "ibv_open_device": unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
    close_device = "ibv_close_device": unsafe extern "C" fn(*mut ibv_context) -> c_int;
    query_device = "ibv_query_device": unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    /// The exported `ibv_query_port` (see the module documentation).
    query_port = "ibv_query_port": unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    query_gid = "ibv_query_gid": unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    alloc_pd = "ibv_alloc_pd": unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
    dealloc_pd = "ibv_dealloc_pd": unsafe extern "C" fn(*mut ibv_pd) -> c_int;
    create_comp_channel = "ibv_create_comp_channel": unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
    destroy_comp_channel = "ibv_destroy_comp_channel": unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
    create_cq = "ibv_create_cq":
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    destroy_cq = "ibv_destroy_cq": unsafe extern "C" fn(*mut ibv_cq) -> c_int;
    get_cq_event = "ibv_get_cq_event":
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    ack_cq_events = "ibv_ack_cq_events": unsafe extern "C" fn(*mut ibv_cq, c_uint);
    create_qp = "ibv_create_qp": unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    modify_qp = "ibv_modify_qp": unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    destroy_qp = "ibv_destroy_qp": unsafe extern "C" fn(*mut ibv_qp) -> c_int;
    reg_mr = "ibv_reg_mr": unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    dereg_mr = "ibv_dereg_mr": unsafe extern "C" fn(*mut ibv_mr) -> c_int;
}

/// The library once loaded (it stays loaded: device contexts and their providers live in it). A failed load is
/// not remembered, so a later open tries again.
static LOADED: Mutex<Option<&'static Ibv>> = Mutex::new(None);

/// The loaded library, loading it at the first call: `LEASEBOX_IBVERBS` when set, else [`DEFAULT_PATH`].
pub fn ibv() -> Result<&'static Ibv, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = *loaded {
        return Ok(l);
    }
    let path = std::env::var(PATH_VAR).ok().filter(|p| !p.is_empty());
    let l: &'static Ibv = Box::leak(Box::new(load(path.as_deref().unwrap_or(DEFAULT_PATH))?));
    *loaded = Some(l);
    Ok(l)
}

/// The last `dlerror()` message.
fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message valid until the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        String::from("no detail")
    } else {
        // SAFETY: non-null: a NUL-terminated string (see above), copied at once.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Why the library could not be used, and what to install.
fn load_error(path: &str, why: &str) -> String {
    format!(
        "{path} could not be loaded ({why}): install rdma-core's libibverbs1 and ibverbs-providers \
         (apt install libibverbs1 ibverbs-providers)"
    )
}

/// Loads `path` and resolves every verb of [`Ibv`]. The handle is never closed.
pub fn load(path: &str) -> Result<Ibv, String> {
    let c_path = CString::new(path).map_err(|_| load_error(path, "the path holds a NUL byte"))?;
    // SAFETY: a NUL-terminated path; loading runs the library's initialisers, which is what using it takes.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(load_error(path, &dlerror()));
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c_name = CString::new(name).map_err(|_| load_error(path, "a symbol name holds a NUL byte"))?;
        // SAFETY: `handle` is a live dlopen handle; the name is NUL-terminated.
        let p = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
        if p.is_null() { Err(load_error(path, &format!("it has no {name}: {}", dlerror()))) } else { Ok(p) }
    };
    resolve(sym)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_the_packages() {
        let Err(e) = load("/nonexistent/libibverbs.so.1") else { panic!("loaded a file that does not exist") };
        assert!(e.starts_with("/nonexistent/libibverbs.so.1 could not be loaded ("), "{e}");
        assert!(e.contains("apt install libibverbs1 ibverbs-providers"), "{e}");
    }

    #[test]
    fn a_library_without_the_verbs_says_which_is_missing() {
        // libc is loaded in every process and has none of them.
        let Err(e) = load("libc.so.6") else { panic!("libc resolved ibv_get_device_list") };
        assert!(e.contains("it has no ibv_get_device_list"), "{e}");
    }

    /// Every name resolves in the installed libibverbs (building the `verbs` feature needs libibverbs-dev,
    /// which brings the library).
    #[test]
    fn the_installed_library_has_every_verb() {
        if let Err(e) = load(DEFAULT_PATH) {
            panic!("{e}");
        }
    }
}
