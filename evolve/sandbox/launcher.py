"""Inside a sandbox container: one fresh harness per request, run as an unprivileged user.

Standalone (standard library only, like harness.py): the Docker backend runs this file's
source with `python3 -I -c` as the container's main process, under tini, with the harness
source as its argument. It runs as root holding only CAP_SETUID and CAP_SETGID, so that
  - every candidate runs as uid/gid 65534 and can neither signal nor ptrace it;
  - it alone judges whether a candidate left anything behind: its view of /proc is one a
    candidate cannot tamper with;
  - a candidate costs a fork and an exec of a fresh interpreter, not a `docker exec`
    (runc: 45-90 ms measured on a 2-core machine).
It never touches a file a candidate made: reading the log and wiping /work is done by a
forked helper that has become uid 65534 first.

Protocol on the container's attached stdin/stdout, the engine's only way in:
  request:  one JSON line {"program", "entry_point", "cases", "code", "env", "log_limit",
            "log_tail"}
  replies:  frames of kind (1 byte), length (4 bytes, big-endian), payload:
            b"H" once, when ready;  b"R" results bytes, as the harness writes them;
            b"E" at the end: JSON {"exit": code or -signal, "run_s": seconds from fork
                                   to exit, "log_tail": str, "clean": bool, "why": str,
                                   "oom_kills": int, and "fault": str if it failed}.
"clean" means no thread of the candidate's uid is left (in any state), /work, /dev/shm and
/dev/mqueue are empty again and have the owner and mode they started with; otherwise the
engine replaces the container. "fault" (with "clean": false) means the launcher itself failed,
e.g. could not start the harness: the engine retries the candidate in a fresh container.
"oom_kills": how many processes the memory limit killed during the run (-1: unknown).
"""
import json
import os
import resource
import select
import shutil
import stat
import sys
import time

HARNESS_SOURCE = sys.argv[1]  # python -c CODE ARG: argv is ["-c", ARG]
CANDIDATE_ID = 65534  # nobody / nogroup
WORKDIR = "/work"
WIPED = ("/work", "/dev/shm", "/dev/mqueue")
PYTHON = "/usr/bin/python3"
KILL_ROUNDS = 8  # kill, look again: about 0.5 s in all before the container is given up


def send(kind, payload=b""):
    sys.stdout.buffer.write(kind + len(payload).to_bytes(4, "big") + payload)
    sys.stdout.buffer.flush()


def main():
    global MOUNTS
    MOUNTS = mount_state()  # as the engine made them; checked after every candidate
    send(b"H")
    for line in sys.stdin.buffer:
        try:
            report = evaluate(json.loads(line))
        except Exception as exc:  # e.g. fork failing: say why; the engine replaces us
            report = {"exit": None, "log_tail": "", "clean": False, "why": repr(exc),
                      "fault": f"the launcher failed: {exc!r}"}
        send(b"E", json.dumps(report).encode())


def evaluate(request):
    results_r, results_w = os.pipe()
    failed_r, failed_w = os.pipe2(os.O_CLOEXEC)  # closed by the exec: empty unless it failed
    oom_before = oom_kills()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(failed_r)
        start_harness(request, results_w, failed_w)  # never returns
    os.close(results_w)
    os.close(failed_w)
    failed = read_all(failed_r)  # returns at the exec (or the failure), not at the exit
    status = relay(results_r, pid)
    run_s = time.monotonic() - start
    os.close(results_r)
    if failed:  # our machinery, not the candidate: the engine retries it in a fresh container
        return {"exit": status, "fault": failed.decode(errors="replace"), "clean": False,
                "log_tail": "", "why": "the launcher could not start the harness"}
    why = kill_candidate()
    report = clean_up(request["log_tail"], wipe=not why)
    why = why or report["why"] or kill_candidate() or mounts_changed()
    return {"exit": status, "run_s": run_s, "log_tail": report["log_tail"],
            "oom_kills": oom_kills() - oom_before, "clean": not why, "why": why}


def read_all(fd):
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def become_candidate():
    os.setgroups([])
    os.setgid(CANDIDATE_ID)
    os.setuid(CANDIDATE_ID)  # drops every capability; no-new-privileges keeps them dropped


def start_harness(request, results_w, failed_w):
    """In the forked child: become the candidate's user and exec a fresh harness. A failure
    before the exec is reported on failed_w (a close-on-exec pipe)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")  # out of memory, the kernel kills the candidate, not us
        become_candidate()
        os.chdir(WORKDIR)
        log_fd = os.open("candidate.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        os.dup2(log_fd, 2)  # from here on, failures (the harness's own included) are logged
        with open("candidate.py", "x", encoding="utf-8") as program:  # "x": /work is empty
            program.write(request["code"])
        spec = {key: request[key] for key in ("program", "entry_point", "cases")}
        spec_fd = os.open(".spec", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(".spec")  # readable through the fd only
        with os.fdopen(os.dup(spec_fd), "w") as spec_file:
            json.dump(spec, spec_file)
        os.lseek(spec_fd, 0, os.SEEK_SET)
        limit = request["log_limit"]
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.dup2(spec_fd, 0)
        os.dup2(results_w, 1)
        os.execve(PYTHON, ["python3", "-I", "-c", HARNESS_SOURCE], request["env"])
    except BaseException as exc:
        os.write(failed_w, f"could not start the harness: {exc!r}".encode())
    finally:
        os._exit(127)


def relay(results_r, pid):
    """Forward the results pipe until the harness exits; returns its exit code or -signal.

    Waits on the harness's exit, not on EOF: forked workers of the candidate may keep the
    pipe open forever.
    """
    exited = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([results_r, exited], [], [])
            if results_r in ready:
                data = os.read(results_r, 65536)
                if data:
                    send(b"R", data)
                    continue
            break  # EOF, or the harness exited
        os.set_blocking(results_r, False)
        try:
            while data := os.read(results_r, 65536):  # what it wrote just before exiting
                send(b"R", data)
        except BlockingIOError:
            pass
    finally:
        os.close(exited)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def candidate_tasks():
    """Every thread of the candidate's uid, in any state: a zombie leader whose other threads
    still run shows as Z, so threads are looked at one by one (/proc/PID/task/TID)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone while we looked
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as status:
                    uids = next(line for line in status if line.startswith("Uid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            if str(CANDIDATE_ID) in uids:
                found.append(f"{pid}/{tid}")
    return found


def kill_candidate():
    """Kill every process of the candidate's uid; '' once /proc shows none, else why not.

    kill(-1, SIGKILL) sent as that uid reaches each of its processes, whatever their session,
    group or state, and nothing else (the launcher and tini are root). tini reaps them.
    """
    for attempt in range(KILL_ROUNDS):
        tasks = candidate_tasks()
        if not tasks:
            return ""
        as_candidate(lambda: os.kill(-1, 9))
        time.sleep(0.002 * 2 ** attempt)
    return f"{len(tasks)} thread(s) of the candidate survived SIGKILL" if candidate_tasks() else ""


def as_candidate(action):
    """Run action() in a forked child that has become the candidate's user; wait for it."""
    pid = os.fork()
    if pid == 0:
        try:
            become_candidate()
            action()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def oom_kills():
    """The container's OOM kill count (cgroup v2, then v1); -1 where neither can be read."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"),
                      ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as events:
                for line in events:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return -1


def mount_state():
    """Owner and mode of every place a candidate may write, as the next candidate needs it."""
    state = {}
    for folder in WIPED:
        try:
            st = os.lstat(folder)
            state[folder] = (st.st_uid, st.st_gid, stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
        except OSError:
            state[folder] = None
    return state


def mounts_changed():
    """'' if every writable mount is as the container started; else which one is not."""
    now = mount_state()
    for folder, (uid, gid, kind, mode) in ((f, s) for f, s in MOUNTS.items() if s is not None):
        if now[folder] != (uid, gid, kind, mode):
            return f"{folder} changed owner or mode"
    return ""


def clean_up(tail_bytes, wipe):
    """A helper, forked and made uid 65534 (not dumpable: no one can ptrace it), reads the
    log's tail and, if asked, wipes; its report comes back through a pipe."""
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_r)
            become_candidate()
            report = {"log_tail": read_tail(os.path.join(WORKDIR, "candidate.log"), tail_bytes),
                      "why": wipe_all() if wipe else ""}
            os.write(report_w, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(report_w)
    chunks = []
    while chunk := os.read(report_r, 65536):
        chunks.append(chunk)
    os.close(report_r)
    os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {"log_tail": "", "why": "the clean-up helper failed"}


def read_tail(path, size):
    """The last bytes of a regular file; a candidate may have swapped in a fifo or a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        os.lseek(fd, max(0, os.fstat(fd).st_size - size), os.SEEK_SET)
        return os.read(fd, size).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def wipe_all():
    """Empty every place a candidate can write; '' if that worked, else the reason. /work is
    ours (uid 65534): a candidate may have made it read-only, so its mode is reset first."""
    try:
        os.chmod(WORKDIR, MOUNTS[WORKDIR][3])
    except (OSError, TypeError) as exc:
        return f"could not reset the mode of {WORKDIR}: {exc}"
    for folder in WIPED:
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            except OSError as exc:
                return f"could not wipe {path}: {exc.strerror}"
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as table:
            if len(table.read().splitlines()) > 1:
                return f"SysV IPC ({kind}) objects left behind"
    return ""


if __name__ == "__main__":
    main()
