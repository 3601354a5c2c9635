//! The seccomp filter of local sandboxes (`sandgate::localbox::seccomp`): every call of
//! its list is refused from inside a real sandbox, and the filter, installed on a root
//! process on the host, refuses each of them even where the kernel would have let root
//! through (so an `EPERM` here cannot be the kernel's own capability check). Ordinary work
//! (threads, fork, pipelines) goes on. The same workload through the gateway (git, pip,
//! curl through the proxy) is in `local_provider`.
//!
//! Each probe calls `syscall(2)` from Python's `ctypes` with arguments the kernel refuses
//! harmlessly (a bad pointer, a closed descriptor, invalid flags, a path that does not
//! exist) with anything but `EPERM` when the filter lets the call through.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::common::root_or_skip;
use crate::localbox::{id, run, runtime, spec, text};
use sandgate::localbox::seccomp::{self, Refusal};

/// Calls each `[label, number, args]` of `argv[1]` (ints, or strings passed as C strings)
/// and prints `{label: [result, errno name or null]}`.
const PROBE: &str = r#"
import ctypes, errno, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for label, nr, args in json.loads(sys.argv[1]):
    cargs = [ctypes.c_long(a) if isinstance(a, int) else ctypes.c_char_p(a.encode()) for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *cargs)
    e = ctypes.get_errno()
    out[label] = [r, errno.errorcode.get(e, str(e)) if r == -1 else None]
print(json.dumps(out))
"#;

/// Bit 30 marks an x32 call on x86_64.
const X32: i64 = 0x4000_0000;
const NOWHERE: &str = "/nonexistent-sandgate-seccomp";

/// Arguments for one listed call that make the kernel answer something other than `EPERM`
/// (to a root caller) when the filter lets it through; none has an effect.
fn harmless_args(name: &str) -> Vec<Value> {
    let (bad_ptr, bad_fd, bad_flags) = (json!(1), json!(-1), json!(0xffff_ffffu32));
    match name {
        "setns" => vec![bad_fd, json!(0)],
        "clone3" => vec![json!(0), json!(0)],
        "init_module" => vec![json!(0), json!(0), json!("")],
        "finit_module" => vec![bad_fd, json!(""), json!(0)],
        "delete_module" => vec![json!("sandgate_no_such_module"), json!(0)],
        "ptrace" => vec![
            json!(libc::PTRACE_PEEKDATA),
            json!(0x3fff_ffff),
            json!(0),
            json!(0),
        ],
        "process_vm_readv" | "process_vm_writev" => {
            vec![json!(1), json!(0), json!(0), json!(0), json!(0), json!(1)]
        }
        "pidfd_getfd" => vec![bad_fd, json!(0), json!(0)],
        "add_key" | "request_key" => vec![bad_ptr, json!(0), json!(0), json!(0), json!(0)],
        "keyctl" => vec![json!(9999), json!(0), json!(0), json!(0), json!(0)],
        "bpf" => vec![json!(9999), json!(0), json!(0)],
        "perf_event_open" => vec![bad_ptr, json!(0), json!(-1), json!(-1), json!(0)],
        "mount" => vec![
            bad_ptr.clone(),
            bad_ptr.clone(),
            bad_ptr.clone(),
            json!(0),
            bad_ptr,
        ],
        "umount2" => vec![json!(NOWHERE), json!(0x8000_0000u32)],
        "pivot_root" => vec![bad_ptr.clone(), bad_ptr],
        "chroot" | "acct" => vec![bad_ptr],
        "move_mount" => vec![bad_fd.clone(), json!(""), bad_fd, json!(""), bad_flags],
        "open_tree" | "fspick" => vec![bad_fd, json!(""), bad_flags],
        "fsopen" => vec![bad_ptr, json!(0)],
        "fsconfig" => vec![bad_fd, json!(0), json!(0), json!(0), json!(0)],
        "fsmount" => vec![bad_fd, bad_flags, json!(0)],
        "mount_setattr" => vec![bad_fd, json!(""), bad_flags, json!(0), json!(0)],
        "open_by_handle_at" => vec![bad_fd, bad_ptr, json!(0)],
        "swapon" => vec![json!(NOWHERE), bad_flags],
        "swapoff" => vec![json!(NOWHERE)],
        "reboot" => vec![json!(0), json!(0), json!(0), json!(0)],
        "kexec_load" => vec![json!(0), json!(9999), json!(0), json!(0)],
        "kexec_file_load" => vec![bad_fd.clone(), bad_fd, json!(0), json!(0), bad_flags],
        "quotactl" => vec![json!(0), json!(0), json!(0), json!(0)],
        "syslog" => vec![json!(9999), json!(0), json!(0)],
        "userfaultfd" => vec![bad_flags],
        "io_uring_setup" => vec![json!(0), bad_ptr],
        "io_uring_enter" => vec![bad_fd, json!(0), json!(0), json!(0), json!(0), json!(0)],
        "io_uring_register" => vec![bad_fd, json!(0), json!(0), json!(0)],
        "iopl" => vec![json!(9)],
        "ioperm" => vec![json!(0xffff_ffffu32), json!(1), json!(0)],
        other => panic!("no probe for the listed call {other}: add harmless arguments here"),
    }
}

/// Every probe with the errno the filter answers: one per listed call, one per namespace
/// flag for `clone` and `unshare`, and an x32 call on x86_64.
fn probes() -> Vec<(String, i64, Vec<Value>, &'static str)> {
    let mut out = Vec::new();
    for (_, call) in seccomp::calls() {
        match call.refusal {
            Refusal::Always => out.push((
                call.name.to_string(),
                call.nr,
                harmless_args(call.name),
                "EPERM",
            )),
            Refusal::Unavailable => out.push((
                call.name.to_string(),
                call.nr,
                harmless_args(call.name),
                "ENOSYS",
            )),
            Refusal::NewNamespace => out.extend(namespace_probes(call.name, call.nr)),
        }
    }
    if cfg!(target_arch = "x86_64") {
        out.push(("x32 getpid".into(), X32 | libc::SYS_getpid, vec![], "EPERM"));
    }
    out
}

/// `unshare(flag | 1)` and `clone(flag | CLONE_THREAD)`: both invalid without the filter
/// (`EINVAL` before anything is made).
fn namespace_probes(name: &str, nr: i64) -> Vec<(String, i64, Vec<Value>, &'static str)> {
    let flags = [
        ("NEWNS", libc::CLONE_NEWNS),
        ("NEWCGROUP", libc::CLONE_NEWCGROUP),
        ("NEWUTS", libc::CLONE_NEWUTS),
        ("NEWIPC", libc::CLONE_NEWIPC),
        ("NEWUSER", libc::CLONE_NEWUSER),
        ("NEWPID", libc::CLONE_NEWPID),
        ("NEWNET", libc::CLONE_NEWNET),
        ("NEWTIME", 0x80),
    ];
    flags
        .into_iter()
        .filter(|(flag, _)| name == "unshare" || *flag != "NEWTIME")
        .map(|(flag, bits)| {
            let args = if name == "unshare" {
                vec![json!(bits | 1)]
            } else {
                vec![
                    json!(bits | libc::CLONE_THREAD),
                    json!(0),
                    json!(0),
                    json!(0),
                    json!(0),
                ]
            };
            (format!("{name}(CLONE_{flag})"), nr, args, "EPERM")
        })
        .collect()
}

fn probe_argv() -> String {
    let list: Vec<Value> = probes()
        .into_iter()
        .map(|(label, nr, args, _)| json!([label, nr, args]))
        .collect();
    serde_json::to_string(&list).unwrap()
}

type Answers = BTreeMap<String, (i64, Option<String>)>;

fn parse(stdout: &[u8], stderr: &[u8]) -> Answers {
    serde_json::from_slice(stdout).unwrap_or_else(|e| {
        panic!(
            "probe output: {e}\nstdout: {}\nstderr: {}",
            text(stdout),
            text(stderr)
        )
    })
}

/// The probes whose answer is not the filter's.
fn not_refused(answers: &Answers) -> Vec<String> {
    probes()
        .into_iter()
        .filter(|(label, _, _, errno)| {
            answers.get(label).map(|(r, e)| (*r, e.as_deref())) != Some((-1, Some(*errno)))
        })
        .map(|(label, ..)| format!("{label}: {:?}", answers.get(&label)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listed_call_is_refused_inside_a_sandbox() {
    let Some((rt, _dir)) = runtime("seccomp_refuses", vec![]) else {
        return;
    };
    assert!(
        rt.capabilities().seccomp,
        "this machine ({}) must run sandboxes under the filter",
        std::env::consts::ARCH
    );
    let id = id("seccomp");
    rt.create(spec(&id)).await.expect("create");
    let out = run(&rt, &id, &["python3", "-c", PROBE, &probe_argv()]).await;
    assert_eq!(out.code(), Some(0), "{}", text(&out.stderr));
    let answers = parse(&out.stdout, &out.stderr);
    let missed = not_refused(&answers);
    assert!(missed.is_empty(), "not refused by the filter: {missed:#?}");
    let status = run(&rt, &id, &["grep", "^Seccomp:", "/proc/self/status"]).await;
    assert_eq!(text(&status.stdout).split_whitespace().last(), Some("2"));
    rt.delete(&id).await.expect("delete");
}

#[test]
fn the_filter_refuses_each_listed_call_even_to_root() {
    if !root_or_skip("local_seccomp::even_to_root") {
        return;
    }
    let python = |filter: Option<Arc<seccomp::Filter>>| {
        let mut cmd = std::process::Command::new("python3");
        cmd.args(["-c", PROBE, &probe_argv()]);
        if let Some(filter) = filter {
            // SAFETY: install() only makes system calls on data built before the fork.
            unsafe {
                cmd.pre_exec(move || filter.install());
            }
        }
        let out = cmd.output().expect("python3");
        assert!(out.status.success(), "{}", text(&out.stderr));
        parse(&out.stdout, &out.stderr)
    };
    // Without the filter, root gets the kernel's answer to the bad arguments: never EPERM,
    // so the refusals below are the filter's.
    let unfiltered = python(None);
    let eperm: Vec<_> = unfiltered
        .iter()
        .filter(|(_, (_, e))| e.as_deref() == Some("EPERM"))
        .collect();
    assert!(eperm.is_empty(), "the kernel itself refused: {eperm:?}");
    assert_eq!(unfiltered.len(), probes().len());
    let filtered = python(Some(Arc::new(seccomp::Filter::new().expect("filter"))));
    let missed = not_refused(&filtered);
    assert!(missed.is_empty(), "not refused by the filter: {missed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_forks_and_pipelines_still_work_under_the_filter() {
    let Some((rt, _dir)) = runtime("seccomp_ordinary", vec![]) else {
        return;
    };
    let id = id("seccomp-ok");
    rt.create(spec(&id)).await.expect("create");
    const WORK: &str = r#"
import ctypes, os, subprocess, threading
results = []
threads = [threading.Thread(target=lambda i=i: results.append(i * i)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
libc = ctypes.CDLL(None, use_errno=True)
# unshare without a namespace flag is allowed: only CLONE_NEW* are refused.
files = libc.unshare(0x400)
piped = subprocess.run("seq 1 1000 | sort -rn | head -n 1", shell=True, capture_output=True, text=True)
print(sorted(results) == [i * i for i in range(8)], os.waitstatus_to_exitcode(status), files, piped.stdout.strip())
"#;
    let out = run(&rt, &id, &["python3", "-c", WORK]).await;
    assert_eq!(out.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "True 7 0 1000");
    let out = run(
        &rt,
        &id,
        &["bash", "-c", "(echo a; echo b) | tr a-z A-Z | wc -l & wait"],
    )
    .await;
    assert_eq!(text(&out.stdout).trim(), "2", "{}", text(&out.stderr));
    rt.delete(&id).await.expect("delete");
}
