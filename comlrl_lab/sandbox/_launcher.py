"""The sandbox launcher: a script, run by a system Python, that runs one untrusted program in a locked-down child.

It is started by ``comlrl_lab.sandbox.runner`` as ``python3 -I -S -B _launcher.py`` with a minimal environment,
reads one JSON request on stdin and writes one JSON result on stdout. It is never imported by comlrl_lab, uses the
standard library only and runs on Python 3.8 or later, so any system interpreter can run it.

Who does what:

- The launcher (trusted, never runs untrusted code) makes the namespaces, forks the child, enforces the wall clock
  by killing the child's whole process tree, caps what it reads of the child's output and reports.
- The child, before any untrusted code: a session of its own, a private mount namespace with a fresh /proc, every
  mount read-only, an empty tmpfs as working folder and HOME, home folders and /dev/shm hidden, resource limits,
  an unprivileged uid/gid (root) or no capabilities (user namespace), no new privileges, an empty environment,
  stdin from /dev/null and only its output pipes open. Then the harness execs the program and its tests.

Isolation modes, best first: ``root-namespaces`` (run as root: pid, net, ipc, uts and mount namespaces, then
setuid to an unprivileged uid), ``user-namespaces`` (not root: the same inside a user namespace, capabilities
dropped), ``rlimits`` (no namespace can be made: resource limits, a session of its own, a subreaper sweep of every
descendant and, as root, the uid drop). Each run reports what it could not enforce.

The test count comes from a harness in the same process as the program, so a program written to forge the
harness's report could inflate its own count; it cannot reach the host. ``docs/sandbox.md`` has the details.
"""

import builtins
import contextlib
import ctypes
import io
import json
import os
import select
import signal
import sys
import time

try:
    import resource
except ImportError:  # not POSIX: the runner refuses such hosts before starting us
    resource = None

# Nothing is imported for the program ahead of time: a launcher lives for one run, so that would only move the cost
# (and most programs need few modules). What a program imports is read after the uid drop; the runner's probe
# checks that the interpreter's library is readable then.

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
# Per-mount flags a bind remount must repeat: inside a user namespace they are locked and may not be cleared.
MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}  # fmt: skip
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 24, 36, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

REPORT_LIMIT = 1 << 20  # bytes of harness records read; a program cannot make the launcher hold more
DRAIN_AFTER_EXIT_S = 0.5
HIDING_TMPFS = "size=4k,nr_inodes=16,mode=755"  # an empty read-only folder laid over one to hide


class SetupError(Exception):
    """A protection the run needs could not be put in place: the program must not run."""


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


LIBC = _libc()


def _call(name, *args):
    """Call a libc function; ``OSError`` with errno on failure, ``AttributeError`` when libc lacks it."""
    if LIBC is None:
        raise AttributeError(name)
    fn = getattr(LIBC, name)
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _prctl(option, arg2=0):
    _call("prctl", ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def _write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


# --------------------------------------------------------------------------------------------------
# Namespaces (launcher side)


def enter_namespaces(isolation):
    """Unshare what this host allows; the child forked next is pid 1 of a new pid namespace. Returns the mode."""
    if isolation == "rlimits" or LIBC is None or not sys.platform.startswith("linux"):
        return "rlimits"
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if os.geteuid() == 0:
        try:
            _call("unshare", ctypes.c_int(flags))
            return "root-namespaces"
        except OSError:
            pass
    uid, gid = os.geteuid(), os.getegid()
    try:
        _call("unshare", ctypes.c_int(flags | CLONE_NEWUSER))
    except (OSError, AttributeError):
        pass
    else:
        try:
            _write_file("/proc/self/setgroups", "deny")
            _write_file("/proc/self/uid_map", f"0 {uid} 1")
            _write_file("/proc/self/gid_map", f"0 {gid} 1")
        except OSError as exc:  # inside a user namespace without ids: no way back to a plain process
            raise SetupError(f"user namespace made, but its uid map could not be written: {exc}") from None
        return "user-namespaces"
    if isolation == "namespaces":
        raise SetupError("isolation='namespaces' was asked for, but this host lets no namespace be made")
    return "rlimits"


# --------------------------------------------------------------------------------------------------
# The child's set-up, before any untrusted code


def _mountinfo():
    """(mount point, per-mount options) of every mount, parents first."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")  # \040 is a space
            out.append((point, set(parts[5].split(","))))
    return out


def _under(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def private_filesystem(req, mode, notes):
    """A mount namespace of our own: fresh /proc, everything read-only, secrets hidden, a tmpfs working folder."""
    _call("unshare", ctypes.c_int(CLONE_NEWNS))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    mounts = _mountinfo()  # read through the host's /proc, before ours covers it
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        notes["enforced"].append("fresh /proc")
    except OSError:
        # A user namespace may not mount proc where the host masks parts of it (containers): hide it instead.
        _mount("tmpfs", "/proc", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, HIDING_TMPFS)
        notes["not_enforced"].append("fresh /proc (hidden instead)")
    root_ro = False
    for point, options in mounts:
        if _under(point, "/proc"):
            continue
        if "ro" in options:
            root_ro = root_ro or point == "/"
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= MOUNT_OPTION_FLAGS.get(option, 0)
        try:
            _mount(None, point, None, flags)
            root_ro = root_ro or point == "/"
        except OSError as exc:
            notes["not_enforced"].append(f"read-only {point} ({exc.strerror})")
    if root_ro:
        notes["enforced"].append("read-only filesystem")
    else:
        raise SetupError("could not make the filesystem read-only")
    # The interpreter must stay readable: a folder holding it is not hidden (and that is reported).
    keep = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__))}
    hidden = []
    for folder in req["hide"]:
        if not os.path.isdir(folder):
            continue
        real = os.path.realpath(folder)
        if any(_under(k, real) for k in keep):
            notes["not_enforced"].append(f"hide {folder} (it holds the interpreter)")
            continue
        try:
            _mount("tmpfs", real, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, HIDING_TMPFS)
        except OSError as exc:
            notes["not_enforced"].append(f"hide {folder} ({exc.strerror})")
            continue
        hidden.append(folder)
    if hidden:
        notes["enforced"].append("hidden: " + " ".join(hidden))
    owner = (0, 0) if mode == "user-namespaces" else (req["uid"], req["gid"])
    data = f"size={req['limits']['disk_bytes']},nr_inodes=1024,mode=700,uid={owner[0]},gid={owner[1]}"
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, data)
    notes["enforced"].append("empty tmpfs working folder")
    return "/tmp"


def _processes_of(uid):
    """How many processes ``uid`` runs now, from /proc (0 where /proc cannot be read)."""
    count = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if name.isdigit():
            try:
                if os.stat("/proc/" + name).st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def set_limits(limits, nproc, notes):
    """Every rlimit, soft == hard, so the program cannot raise them back; CPU gets one second's grace to SIGKILL."""
    cpu = int(limits["cpu_time_s"] + 0.999)
    table = [
        ("RLIMIT_CORE", 0, 0, "no core files"),
        ("RLIMIT_CPU", cpu, cpu + 1, "CPU time"),
        ("RLIMIT_AS", limits["memory_bytes"], limits["memory_bytes"], "address space"),
        ("RLIMIT_FSIZE", limits["disk_bytes"], limits["disk_bytes"], "file size"),
        ("RLIMIT_NOFILE", limits["max_open_files"], limits["max_open_files"], "open files"),
        ("RLIMIT_NPROC", nproc, nproc, "processes"),
    ]
    for name, soft, hard, what in table:
        which = getattr(resource, name, None)
        if which is None:
            notes["not_enforced"].append(f"{what} limit (no {name} here)")
            continue
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            raise SetupError(f"setrlimit {name}: {exc}") from None
        notes["enforced"].append(f"{what} limit")
    if sys.platform == "darwin":
        notes["not_enforced"].append("address space limit (macOS does not enforce RLIMIT_AS)")


def drop_privileges(req, mode, notes):
    """No way back to the trainer's powers: an unprivileged uid (root) or no capabilities (user namespace)."""
    if mode == "user-namespaces":
        for cap in range(64):
            try:
                _prctl(PR_CAPBSET_DROP, cap)
            except OSError:
                break  # EINVAL past the last capability this kernel knows
        with contextlib.suppress(OSError):
            _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable for capabilities 0-31 and 32-63: none
        _call("capset", header, data)
        notes["enforced"].append("no capabilities")
        notes["not_enforced"].append("runs as the trainer's user (files it may read outside hidden folders)")
    elif os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(req["gid"], req["gid"], req["gid"])
        os.setresuid(req["uid"], req["uid"], req["uid"])
        if 0 in os.getresuid() or 0 in os.getresgid():
            raise SetupError("the uid drop did not take")
        notes["enforced"].append(f"uid/gid {req['uid']}/{req['gid']}")
    else:
        notes["not_enforced"].append("runs as the trainer's user: it may signal and read that user's processes")
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        notes["enforced"].append("no new privileges")
    except (OSError, AttributeError):
        notes["not_enforced"].append("no_new_privs (setuid programs keep their powers)")
    with contextlib.suppress(OSError, AttributeError):
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change, so set after it


def setup_child(req, mode, report, notes):
    """Everything between fork and the first untrusted byte; ``SetupError`` stops the run."""
    os.setsid()  # kill(0, ...) and killpg reach this group only, never the launcher's
    limits = req["limits"]
    uid = req["uid"] if os.geteuid() == 0 and mode != "user-namespaces" else os.geteuid()
    # RLIMIT_NPROC counts every process of the uid; in a user namespace only those inside it.
    already = 0 if mode == "user-namespaces" else _processes_of(uid)
    if mode == "rlimits":
        work = req["workdir"]
        notes["not_enforced"].extend(
            ["network (no namespace)", "process isolation (no pid namespace)", "read-only filesystem"]
        )
    else:
        notes["enforced"].extend(["no network", "own pid namespace"])
        work = private_filesystem(req, mode, notes)
    set_limits(limits, already + limits["max_processes"], notes)
    drop_privileges(req, mode, notes)
    os.chdir(work)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work})
    notes["enforced"].append("empty environment")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.closerange(3, report)
    os.closerange(report + 1, 1 << 16)


# --------------------------------------------------------------------------------------------------
# The harness: the program, then its tests, one guarded step at a time


class StepTimeout(BaseException):
    """One test ran past its time budget (raised by SIGALRM inside the program's code)."""


class Steps:
    """Arms the per-test timer around each step of the generated check and reports each test's outcome."""

    def __init__(self, out, seconds):
        self.out, self.seconds = out, seconds

    def begin(self):
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def end(self, index, error):
        signal.setitimer(signal.ITIMER_REAL, 0)
        if index < 0:
            return  # a set-up step: not a test
        outcome = "pass" if error is None else "timeout" if isinstance(error, StepTimeout) else "fail"
        self.out.write(f"T {index} {outcome}\n")


def _on_alarm(signum, frame):
    raise StepTimeout()


def harness(req, out):
    """Exec the program as a script; if it loads, run the check steps. Returns the exit status."""
    sys.argv = ["program"]
    sys.stdin = io.StringIO(req["stdin"])
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(req["program"], "<program>", "exec"), namespace)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out.write("L SystemExit\n")
        return code
    except BaseException as exc:
        out.write(f"L {type(exc).__name__}\n")
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the program's frame on
        return 1
    out.write("L ok\n")
    if req["check"]:
        signal.signal(signal.SIGALRM, _on_alarm)
        steps = Steps(out, req["limits"]["per_test_time_s"])
        try:
            exec(compile(req["check"], "<tests>", "exec"), namespace)
            namespace.pop("__sandbox_check__")(namespace.get(req["entry_point"]), steps)
        except BaseException:
            signal.setitimer(signal.ITIMER_REAL, 0)  # a step's exception escaped its guard: later tests did not run
    out.write("D\n")
    return 0


def child_main(req, mode, pipes):
    out_w, err_w, report_w = pipes
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    report = os.fdopen(report_w, "w", buffering=1, encoding="utf-8")
    notes = {"enforced": [], "not_enforced": []}
    try:
        setup_child(req, mode, report_w, notes)
    except BaseException as exc:
        report.write("S " + json.dumps(f"{type(exc).__name__}: {exc}") + "\n")
        report.flush()
        os._exit(111)
    report.write(f"N {json.dumps(notes)}\n")
    status = 0
    try:
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="replace")
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="replace")
        status = harness(req, report)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 1
    os._exit(status & 0xFF)


# --------------------------------------------------------------------------------------------------
# The launcher side: wait with a deadline, cap the output, kill the whole tree


def _descendants(root):
    """Pids whose parent chain reaches ``root`` (Linux /proc); orphans come to us as the subreaper."""
    parents = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        found |= frontier
    return sorted(found)


def kill_tree(pid, mode, reaped=False):
    """SIGKILL the child and everything it started; in a pid namespace killing its pid 1 ends them all."""
    if not reaped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if mode != "rlimits":
        return
    for _ in range(50):  # a fork loop races the sweep; RLIMIT_NPROC bounds it, so this converges
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        rest = [p for p in _descendants(os.getpid()) if p != pid]
        for p in rest:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        for p in rest:  # orphans are our children now (subreaper); the main child is reaped by its caller
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, os.WNOHANG)
        if not rest:
            return
        time.sleep(0.01)


def supervise(pid, mode, fds, limits, started):
    """Read the child's pipes until it exits or the wall clock runs out; returns what was collected."""
    caps = {fds[0]: limits["max_output_bytes"], fds[1]: limits["max_output_bytes"], fds[2]: REPORT_LIMIT}
    data = {fd: bytearray() for fd in fds}
    truncated = {fd: False for fd in fds}
    open_fds = set(fds)
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    deadline = started + limits["wall_time_s"]
    status, timed_out, drain_until = None, False, None
    while True:
        now = time.monotonic()
        if status is None:
            if now >= deadline:
                timed_out = True
                kill_tree(pid, mode)
                status = os.waitpid(pid, 0)[1]
                drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
                continue
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                if mode == "rlimits":
                    kill_tree(pid, mode, reaped=True)  # what it left running in the background
                drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
                continue
            wait = deadline - now if pidfd is not None else min(deadline - now, 0.05)  # no pidfd: poll
        else:
            if not open_fds or now >= drain_until:
                break
            wait = drain_until - now
        watch = list(open_fds) + ([pidfd] if pidfd is not None and status is None else [])
        ready, _, _ = select.select(watch, [], [], max(wait, 0))
        for fd in ready:
            if fd == pidfd:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            room = caps[fd] - len(data[fd])
            data[fd] += chunk[: max(room, 0)]
            if len(chunk) > room:
                # Past the cap: stop reading; the program's next write gets EPIPE, so a flood ends quickly.
                truncated[fd] = True
                open_fds.discard(fd)
                os.close(fd)
    if pidfd is not None:
        os.close(pidfd)
    return status, timed_out, data, truncated


def parse_report(raw, total):
    """The harness's records: set-up notes, load result, and the first outcome reported for each test.

    The child writes exactly one of S (set-up failed) and N (notes) before any program code runs, so the first
    of them is trusted and anything after it that claims to be S or N is the program's and ignored: a program
    cannot make its run look like a broken sandbox.
    """
    outcomes, load, notes, setup_error = {}, None, None, None
    for line in raw.decode("utf-8", "replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("S", "N") and notes is None and setup_error is None:
            if kind == "S":
                setup_error = json.loads(rest)
            else:
                notes = json.loads(rest)
        elif kind == "L" and notes is not None and load is None:
            load = rest[:80]  # an exception's name; the program could write anything here
        elif kind == "T" and load == "ok":
            index, _, outcome = rest.partition(" ")
            if index.isdigit() and int(index) < total and outcome in ("pass", "fail", "timeout"):
                outcomes.setdefault(int(index), outcome)
    return outcomes, load, notes, setup_error


def main():
    req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    result = {"error": None}
    try:
        mode = enter_namespaces(req["isolation"])
    except SetupError as exc:
        print(json.dumps({"error": str(exc)}))
        return
    if mode == "rlimits":
        with contextlib.suppress(OSError, AttributeError):
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        import tempfile

        req["workdir"] = tempfile.mkdtemp(prefix="comlrl-sandbox-")
        if os.geteuid() == 0:
            os.chown(req["workdir"], req["uid"], req["gid"])
    pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, report
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        for r, _ in pipes:
            os.close(r)
        child_main(req, mode, [w for _, w in pipes])
    for _, w in pipes:
        os.close(w)

    def on_term(signum, frame):  # the runner gave up on us: take the child down first
        kill_tree(pid, mode)
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    fds = [r for r, _ in pipes]
    status, timed_out, data, truncated = supervise(pid, mode, fds, req["limits"], started)
    wall = time.monotonic() - started
    outcomes, load, notes, setup_error = parse_report(bytes(data[fds[2]]), req["tests_total"])
    if req.get("workdir"):
        import shutil

        shutil.rmtree(req["workdir"], ignore_errors=True)
    result.update(
        isolation=mode,
        error=None if setup_error is None else "sandbox set-up failed: " + setup_error,
        exit_status=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        timed_out=timed_out,
        stdout=bytes(data[fds[0]]).decode("utf-8", "replace"),
        stderr=bytes(data[fds[1]]).decode("utf-8", "replace"),
        stdout_truncated=truncated[fds[0]],
        stderr_truncated=truncated[fds[1]],
        load=load,
        outcomes=[outcomes.get(i, "not run") for i in range(req["tests_total"])],
        enforced=(notes or {}).get("enforced", []),
        not_enforced=(notes or {}).get("not_enforced", []),
        wall_time_s=wall,
    )
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # the answer is out: skipping the interpreter's shutdown saves about a third of a run's time
