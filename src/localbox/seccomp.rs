//! The system calls no process in a local sandbox may make, and the seccomp filter that
//! refuses them.
//!
//! [`REFUSED`] is the one list: each group says why a sandbox has no business making its
//! calls. Every exec installs the filter (with `no_new_privs`) after it entered the
//! sandbox's namespaces and dropped to the sandbox user, just before `execve`, so the
//! command and everything it starts inherit it; nothing can remove a seccomp filter.
//!
//! A refused call fails with `EPERM` instead of killing the process, so programs that probe
//! for a feature (a namespace, io_uring, a keyring) fall back the way they do on any host
//! that forbids it. `clone3` is the exception: its flags sit in memory a filter cannot
//! read, so it answers `ENOSYS`, which makes the C library fall back to `clone`, whose
//! flags the filter checks.
//!
//! Architectures: the list uses the kernel's numbers for x86_64 and aarch64 and the filter
//! first checks that a call comes through that native interface. A call through another
//! one (a 32-bit program using `int 0x80` on x86_64) kills the process: its numbers mean
//! other calls, so the list cannot be applied to it. x32 calls on x86_64 (numbers with bit
//! 30 set) are all refused with `EPERM` for the same reason. Elsewhere the filter is not
//! available: [`supported`] is false, the runtime's capabilities say so and the pool
//! declares it.

use std::io;

/// When a listed call is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Always, with `EPERM`.
    Always,
    /// With `EPERM` when its first argument (the flags of `clone` and `unshare`) asks for a
    /// new namespace; ordinary threads and processes are made with the same calls.
    NewNamespace,
    /// Always, with `ENOSYS` (see the module docs for `clone3`).
    Unavailable,
}

/// One refused system call.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub name: &'static str,
    /// The number on this architecture.
    pub nr: i64,
    pub refusal: Refusal,
}

/// Calls refused for one reason.
#[derive(Debug, Clone, Copy)]
pub struct Group {
    pub name: &'static str,
    pub why: &'static str,
    pub calls: &'static [Call],
}

/// The `CLONE_NEW*` flags: any of them in `unshare`'s or `clone`'s flags makes a namespace.
/// `CLONE_NEWTIME` (0x80) is left out for `clone`, where that bit belongs to the exit
/// signal; `clone` cannot make a time namespace anyway.
const NAMESPACE_FLAGS: [(u64, bool); 8] = [
    (libc::CLONE_NEWNS as u64, true),
    (libc::CLONE_NEWCGROUP as u64, true),
    (libc::CLONE_NEWUTS as u64, true),
    (libc::CLONE_NEWIPC as u64, true),
    (libc::CLONE_NEWUSER as u64, true),
    (libc::CLONE_NEWPID as u64, true),
    (libc::CLONE_NEWNET as u64, true),
    (0x80, false),
];

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! call {
    ($name:ident) => {
        call!($name, Always)
    };
    ($name:ident, $refusal:ident) => {
        named(stringify!($name), nr::$name, Refusal::$refusal)
    };
}

/// The numbers, by the names the list uses.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod nr {
    pub use libc::{
        SYS_acct as acct, SYS_add_key as add_key, SYS_bpf as bpf, SYS_chroot as chroot,
        SYS_clone as clone, SYS_clone3 as clone3, SYS_delete_module as delete_module,
        SYS_finit_module as finit_module, SYS_fsconfig as fsconfig, SYS_fsmount as fsmount,
        SYS_fsopen as fsopen, SYS_fspick as fspick, SYS_init_module as init_module,
        SYS_io_uring_enter as io_uring_enter, SYS_io_uring_register as io_uring_register,
        SYS_io_uring_setup as io_uring_setup, SYS_kexec_file_load as kexec_file_load,
        SYS_kexec_load as kexec_load, SYS_keyctl as keyctl, SYS_mount as mount,
        SYS_mount_setattr as mount_setattr, SYS_move_mount as move_mount,
        SYS_open_by_handle_at as open_by_handle_at, SYS_open_tree as open_tree,
        SYS_perf_event_open as perf_event_open, SYS_pidfd_getfd as pidfd_getfd,
        SYS_pivot_root as pivot_root, SYS_process_vm_readv as process_vm_readv,
        SYS_process_vm_writev as process_vm_writev, SYS_ptrace as ptrace, SYS_quotactl as quotactl,
        SYS_reboot as reboot, SYS_request_key as request_key, SYS_setns as setns,
        SYS_swapoff as swapoff, SYS_swapon as swapon, SYS_syslog as syslog, SYS_umount2 as umount2,
        SYS_unshare as unshare, SYS_userfaultfd as userfaultfd,
    };
    #[cfg(target_arch = "x86_64")]
    pub use libc::{SYS_ioperm as ioperm, SYS_iopl as iopl};
}

/// `c_long` is `i64` on both architectures the list is written for.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const fn named(name: &'static str, nr: i64, refusal: Refusal) -> Call {
    Call { name, nr, refusal }
}

/// Direct access to I/O ports exists on x86 only.
#[cfg(target_arch = "x86_64")]
const IO_PORTS: &[Call] = &[call!(iopl), call!(ioperm)];
#[cfg(target_arch = "aarch64")]
const IO_PORTS: &[Call] = &[];

/// The refused calls, by reason. The README's "Local sandboxes" section lists them.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub const REFUSED: &[Group] = &[
    Group {
        name: "namespaces",
        why: "a new namespace (above all a user namespace) opens kernel code that is otherwise \
              root-only, and joining one is how an escape enters the host's; the sandbox's own \
              namespaces are made for it before it starts",
        calls: &[
            call!(unshare, NewNamespace),
            call!(clone, NewNamespace),
            call!(clone3, Unavailable),
            call!(setns),
        ],
    },
    Group {
        name: "kernel modules",
        why: "loading or removing kernel code is the host's business",
        calls: &[
            call!(init_module),
            call!(finit_module),
            call!(delete_module),
        ],
    },
    Group {
        name: "tracing other processes",
        why: "reading or writing another process's memory or taking its file descriptors; a \
              sandbox debugs nothing outside itself, and nothing inside it needs it to run",
        calls: &[
            call!(ptrace),
            call!(process_vm_readv),
            call!(process_vm_writev),
            call!(pidfd_getfd),
        ],
    },
    Group {
        name: "kernel keyring",
        why: "the keyring is not namespaced: keys are shared with the host's processes of the \
              same uid",
        calls: &[call!(add_key), call!(request_key), call!(keyctl)],
    },
    Group {
        name: "bpf and performance counters",
        why: "programs and probes run in the kernel and see the whole machine; a large, often \
              exploited attack surface",
        calls: &[call!(bpf), call!(perf_event_open)],
    },
    Group {
        name: "mounts",
        why: "the sandbox's file system is laid out for it before it starts; a mount or a new \
              root would change what it sees of the host",
        calls: &[
            call!(mount),
            call!(umount2),
            call!(pivot_root),
            call!(chroot),
            call!(move_mount),
            call!(open_tree),
            call!(fsopen),
            call!(fsconfig),
            call!(fsmount),
            call!(fspick),
            call!(mount_setattr),
            call!(open_by_handle_at),
        ],
    },
    Group {
        name: "host administration",
        why: "swap, reboot, a new kernel, process accounting, disk quotas and the kernel log \
              belong to the host",
        calls: &[
            call!(swapon),
            call!(swapoff),
            call!(reboot),
            call!(kexec_load),
            call!(kexec_file_load),
            call!(acct),
            call!(quotactl),
            call!(syslog),
        ],
    },
    Group {
        name: "userfaultfd",
        why: "lets a process stall the kernel at a chosen point of a copy, the usual tool of \
              kernel race exploits",
        calls: &[call!(userfaultfd)],
    },
    Group {
        name: "io_uring",
        why: "a second system call interface beside the filtered one, and a frequent source of \
              privilege escalations; programs fall back to ordinary I/O",
        calls: &[
            call!(io_uring_setup),
            call!(io_uring_enter),
            call!(io_uring_register),
        ],
    },
    Group {
        name: "I/O ports",
        why: "direct hardware access",
        calls: IO_PORTS,
    },
];

/// No list where the filter is not available (see the module docs).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const REFUSED: &[Group] = &[];

/// Whether this build can filter system calls at all (its architecture is one the list is
/// written for) and the kernel has seccomp filters.
pub fn supported() -> bool {
    if REFUSED.is_empty() {
        return false;
    }
    // SAFETY: PR_GET_SECCOMP takes no pointer; it fails with EINVAL without seccomp.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Every listed call, with its group.
pub fn calls() -> impl Iterator<Item = (&'static Group, &'static Call)> {
    REFUSED
        .iter()
        .flat_map(|g| g.calls.iter().map(move |c| (g, c)))
}

/// The compiled filter, ready to install in a child between `fork` and `execve`.
#[derive(Debug)]
pub struct Filter {
    programs: Vec<seccompiler::BpfProgram>,
}

impl Filter {
    /// Compiles [`REFUSED`] for this architecture.
    pub fn new() -> Result<Filter, String> {
        if REFUSED.is_empty() {
            return Err(format!(
                "no system call list for {}",
                std::env::consts::ARCH
            ));
        }
        let arch =
            seccompiler::TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
        let mut programs = Vec::new();
        if let Some(x32) = x32_guard() {
            programs.push(x32);
        }
        programs.push(compile(arch, Refusal::Unavailable, libc::ENOSYS)?);
        programs.push(compile(arch, Refusal::Always, libc::EPERM)?);
        Ok(Filter { programs })
    }

    /// Sets `no_new_privs` and installs the filter on the calling thread. Only system
    /// calls, on data prepared before: safe between `fork` and `execve`.
    pub fn install(&self) -> io::Result<()> {
        for program in &self.programs {
            seccompiler::apply_filter(program).map_err(|e| match e {
                seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => e,
                _ => io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        }
        Ok(())
    }
}

/// One program: the calls refused with `errno`. `Refusal::Always` also takes the
/// `NewNamespace` calls (same errno, with conditions on their flags).
fn compile(
    arch: seccompiler::TargetArch,
    kind: Refusal,
    errno: i32,
) -> Result<seccompiler::BpfProgram, String> {
    use seccompiler::{SeccompAction, SeccompFilter};
    let mut rules = std::collections::BTreeMap::new();
    for (_, call) in calls() {
        let chain = match (kind, call.refusal) {
            (Refusal::Unavailable, Refusal::Unavailable) | (Refusal::Always, Refusal::Always) => {
                Vec::new()
            }
            (Refusal::Always, Refusal::NewNamespace) => namespace_rules(call.name == "unshare")?,
            _ => continue,
        };
        rules.insert(call.nr, chain);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    seccompiler::BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// One rule per namespace flag: the call matches when any of them is set.
fn namespace_rules(with_time: bool) -> Result<Vec<seccompiler::SeccompRule>, String> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    NAMESPACE_FLAGS
        .iter()
        .filter(|(_, in_clone)| *in_clone || with_time)
        .map(|&(flag, _)| {
            let condition = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(|e| e.to_string())?;
            SeccompRule::new(vec![condition]).map_err(|e| e.to_string())
        })
        .collect()
}

/// On x86_64, x32 calls carry the native architecture but their numbers have bit 30 set, so
/// the list would not match them: refuse them all. seccompiler only matches exact numbers,
/// hence these six instructions (the usual guard, as in the kernel's seccomp samples).
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> Option<seccompiler::BpfProgram> {
    use seccompiler::sock_filter;
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ | BPF_K, BPF_JMP | BPF_JGE | BPF_K,
    // BPF_RET | BPF_K (linux/bpf_common.h).
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const ARCH_OFFSET: u32 = 4;
    const NR_OFFSET: u32 = 0;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    Some(vec![
        op(LD_W_ABS, 0, 0, ARCH_OFFSET),
        // Another architecture: allowed here, the main program kills it.
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(LD_W_ABS, 0, 0, NR_OFFSET),
        op(JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ])
}

#[cfg(not(target_arch = "x86_64"))]
fn x32_guard() -> Option<seccompiler::BpfProgram> {
    None
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
